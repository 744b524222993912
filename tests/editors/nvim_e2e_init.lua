-- Neovim init for the end-to-end test (tests/editors/test_nvim_e2e.py) and the README capture.
-- Environment: KOG_NVIM_PLUGIN (editors/nvim), KOG_E2E_CMD (JSON list: the server command),
-- KOG_E2E_SETTINGS (JSON object: server settings), KOG_E2E_LOG (optional LSP log level).
vim.opt.runtimepath:prepend(os.getenv('KOG_NVIM_PLUGIN'))
vim.o.swapfile = false
vim.o.shadafile = 'NONE'
vim.o.updatetime = 100
vim.o.expandtab = true
vim.o.shiftwidth = 4
vim.o.smartindent = false
vim.o.autoindent = true
vim.o.completeopt = 'menuone,noinsert' -- <C-n> opens the menu without inserting (pum test)
vim.o.laststatus = 2
vim.o.statusline = '%f %= %{get(g:, "kog_status", "")} '
if os.getenv('KOG_E2E_LOG') then
  vim.lsp.set_log_level(os.getenv('KOG_E2E_LOG'))
end

local kog = require('kog')
kog.setup({
  cmd = vim.fn.json_decode(os.getenv('KOG_E2E_CMD')),
  settings = vim.fn.json_decode(os.getenv('KOG_E2E_SETTINGS') or '{}'),
  debounce_ms = 10,
})

-- Probes the test reads with `nvim --server S --remote-expr 'luaeval("KogE2E.x()")'` (JSON strings).
local ghost = require('kog.ghost')
_G.KogE2E = {}

function KogE2E.status()
  local c = kog.client()
  local caps = {}
  if c then
    local sc = c.server_capabilities or {}
    caps = { codeAction = sc.codeActionProvider ~= nil and sc.codeActionProvider ~= false,
             inlineCompletion = sc.inlineCompletionProvider ~= nil }
  end
  return vim.fn.json_encode({ state = kog.status.state or vim.NIL, statusline = kog.statusline(),
    client_id = c and c.id or vim.NIL, message = kog.status.message or vim.NIL,
    attached = c ~= nil and vim.lsp.buf_is_attached(0, c.id), caps = caps, mode = vim.api.nvim_get_mode().mode,
    pum = vim.fn.pumvisible() == 1 })
end

function KogE2E.ghost()
  local buf = vim.api.nvim_get_current_buf()
  local marks = vim.api.nvim_buf_get_extmarks(buf, ghost.namespace, 0, -1, { details = true })
  local out = {}
  for _, m in ipairs(marks) do
    local d = m[4]
    local virt = {}
    for _, l in ipairs(d.virt_lines or {}) do
      virt[#virt + 1] = l[1][1]
    end
    out[#out + 1] = { row = m[2], col = m[3], overlay = d.virt_text and d.virt_text[1][1] or '', virt_lines = virt }
  end
  local cur = ghost.current(buf)
  return vim.fn.json_encode({ extmarks = out, current = cur or vim.NIL,
    cursor = vim.api.nvim_win_get_cursor(0), lines = vim.api.nvim_buf_get_lines(buf, 0, -1, true),
    tick = vim.api.nvim_buf_get_changedtick(buf) })
end

function KogE2E.diagnostics()
  local out = {}
  for _, d in ipairs(vim.diagnostic.get(0)) do
    out[#out + 1] = { lnum = d.lnum, col = d.col, message = d.message, severity = d.severity, source = d.source or vim.NIL }
  end
  return vim.fn.json_encode(out)
end

-- Code action through the built-in client: vim.lsp.buf.code_action() asks vim.ui.select,
-- which the test answers like a user picking the first entry.
KogE2E.picked = nil
function KogE2E.code_action(line)
  vim.api.nvim_win_set_cursor(0, { line + 1, 0 })
  vim.ui.select = function(items, opts, on_choice)
    local titles = {}
    for i, it in ipairs(items) do
      titles[i] = opts.format_item and opts.format_item(it) or tostring(it)
    end
    KogE2E.picked = titles
    on_choice(items[1], 1)
  end
  vim.lsp.buf.code_action()
  return vim.fn.json_encode({ ok = true })
end

function KogE2E.picked_titles()
  return vim.fn.json_encode(KogE2E.picked or vim.NIL)
end
