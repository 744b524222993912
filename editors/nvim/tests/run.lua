-- Minimal test runner for the plugin's Lua unit tests, for Neovim 0.7+ headless:
--   nvim --headless -u NONE -i NONE --cmd 'set rtp^=editors/nvim' -c 'luafile editors/nvim/tests/run.lua'
-- Runs every tests/*_spec.lua next to this file, prints one line per failure and a
-- closing "N passed, N failed" line, and exits non-zero on any failure.
local here = debug.getinfo(1, 'S').source:sub(2):match('(.*/)') or './'
local passed, failed = 0, 0

_G.it = function(name, fn)
  local ok, err = xpcall(fn, debug.traceback)
  if ok then
    passed = passed + 1
  else
    failed = failed + 1
    io.stdout:write('FAIL ' .. name .. '\n' .. tostring(err) .. '\n')
  end
end

_G.eq = function(expected, actual, what)
  if not vim.deep_equal(expected, actual) then
    error(string.format('%s: expected %s, got %s', what or 'value', vim.inspect(expected), vim.inspect(actual)), 2)
  end
end

local files = vim.fn.glob(here .. '*_spec.lua', false, true)
table.sort(files)
for _, f in ipairs(files) do
  local ok, err = pcall(dofile, f)
  if not ok then
    failed = failed + 1
    io.stdout:write('FAIL loading ' .. f .. ': ' .. tostring(err) .. '\n')
  end
end
io.stdout:write(string.format('%d passed, %d failed\n', passed, failed))
vim.cmd(failed == 0 and 'qall!' or 'cquit! 1')
