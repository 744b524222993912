-- Which buffers get the server: the configured filetypes, or with '*' every file buffer but no help / quickfix /
-- terminal-like buffers (they have filetypes too).
local kog = require('kog')

local function buffer(ft, buftype)
  local buf = vim.api.nvim_create_buf(true, false)
  vim.bo[buf].buftype = buftype or ''
  vim.bo[buf].filetype = ft
  return buf
end

it('the configured filetypes are served, others are not', function()
  local saved = kog.config.filetypes
  kog.config.filetypes = { 'python', 'lua' }
  eq(true, kog.serves(buffer('python')), 'python')
  eq(true, kog.serves(buffer('lua', 'nofile')), 'a listed filetype in any buffer')
  eq(false, kog.serves(buffer('rust')), 'rust')
  eq(false, kog.serves(buffer('')), 'no filetype')
  kog.config.filetypes = saved
end)

it("'*' serves every file buffer and no special buffer", function()
  local saved = kog.config.filetypes
  kog.config.filetypes = { '*' }
  eq(true, kog.serves(buffer('rust')), 'rust file')
  eq(true, kog.serves(buffer('typescript')), 'typescript file')
  eq(false, kog.serves(buffer('help', 'help')), 'help')
  eq(false, kog.serves(buffer('qf', 'quickfix')), 'quickfix')
  eq(false, kog.serves(buffer('', '')), 'no filetype')
  kog.config.filetypes = saved
end)
