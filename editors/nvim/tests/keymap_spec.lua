-- The accept keys act only while a suggestion is shown; otherwise <Tab> keeps its previous meaning.
local ghost = require('kog.ghost')
local kog = require('kog')

local term = function(s)
  return vim.api.nvim_replace_termcodes(s, true, false, true)
end

-- Keys our <Tab> expr mapping produces, in key-code form (0.7's vim.keymap wraps the callback
-- and replaces key codes itself; later versions leave that to the mapping's replace_keycodes).
local function tab_keys()
  for _, m in ipairs(vim.api.nvim_get_keymap('i')) do
    if m.desc == 'kog: accept all' then
      local r = m.callback()
      return m.replace_keycodes == 1 and term(r) or r
    end
  end
end

it('<Tab> falls back to the previous mapping when no suggestion is shown, accepts when one is', function()
  vim.keymap.set('i', '<Tab>', '<C-n>', { desc = 'user completion' })
  kog.setup({ filetypes = { 'kog-none' }, ghost = 'extmark' })
  eq('kog: accept all', vim.fn.maparg('<Tab>', 'i', false, true).desc)
  eq(term('<C-n>'), tab_keys(), 'previous mapping kept')
  vim.cmd('enew!')
  vim.bo.buftype = 'nofile'
  vim.api.nvim_buf_set_lines(0, 0, -1, true, { 'x = ' })
  vim.o.virtualedit = 'onemore'
  vim.api.nvim_win_set_cursor(0, { 1, 4 })
  ghost.show(0, { id = 9998, offset_encoding = 'utf-16' }, { insertText = '1' })
  eq(term("<Cmd>lua require('kog.ghost').accept('all')<CR>"), tab_keys())
  ghost.clear(0, true)
  eq(term('<C-n>'), tab_keys())
end)

it('a second setup() does not wrap its own mapping; without a previous one <Tab> is a Tab', function()
  vim.keymap.del('i', '<Tab>')
  kog.setup({ filetypes = { 'kog-none' }, ghost = 'extmark' })
  kog.setup({ filetypes = { 'kog-none' }, ghost = 'extmark' })
  eq(term('<Tab>'), tab_keys())
end)

it('keymaps = false leaves <Tab> alone; statusline reflects status and the toggle', function()
  vim.keymap.del('i', '<Tab>')
  kog.setup({ filetypes = { 'kog-none' }, keymaps = false })
  eq('', vim.fn.maparg('<Tab>', 'i'))
  kog.status = { state = 'ready', backend = 'graph', lastLatencyMs = 41.6, tokPerS = 180.2 }
  eq('kog ready graph 42ms 180tok/s', kog.statusline())
  kog.toggle(false)
  eq('kog off graph 42ms 180tok/s', kog.statusline())
  kog.toggle(true)
  eq({ 'python3', '-m', 'kog_lsp', '--stdio', '--model', 'default', '--device', 'auto', '--backend', 'auto' },
    kog.server_cmd())
end)

it('format_stats renders kog/stats', function()
  local lines = kog.format_stats({ latencyMs = { p50 = 38.26, p95 = 90, count = 12 }, tokPerS = 150.5,
    prefixCacheHitRate = 0.875, completions = 12, cancellations = 3, cacheHits = 4, engine = { backend = 'graph' } })
  eq('  latency p50 / p95: 38.3 / 90.0 ms (12 samples)', lines[2])
  eq('  prefix cache hit rate: 87.5 %', lines[4])
  eq('  completions: 12, cancellations: 3, cache hits: 4', lines[5])
end)
