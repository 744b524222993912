-- Ghost text for inline completions on Neovim versions without vim.lsp.inline_completion
-- (< 0.12): requests textDocument/inlineCompletion itself, draws the suggestion with
-- extmarks (overlay on the cursor line + virt_lines below), keeps it while the user types
-- into it, and accepts it whole, by word or by line. The newest request per buffer wins:
-- older ones are cancelled and their late answers dropped.
local text = require('kog.text')

local M = {}

local ns = vim.api.nvim_create_namespace('kog_ghost')
M.namespace = ns

-- LSP InlineCompletionTriggerKind
M.INVOKED = 1
M.AUTOMATIC = 2

-- Per-buffer state: request = { client_id, id, tick, row, col }, shown = { client_id, item,
-- remaining, row, col, replace_end, tick, extmark }, timer = uv timer for the debounce.
local buffers = {}
M.options = { debounce_ms = 30, enabled = true, client_name = 'kog' }

local function get(buf)
  local s = buffers[buf]
  if not s then
    s = {}
    buffers[buf] = s
  end
  return s
end

-- Client methods became colon methods in 0.11 (the dot form is deprecated there).
local colon_methods = vim.fn.has('nvim-0.11') == 1
local function call(client, method, ...)
  if colon_methods then
    return client[method](client, ...)
  end
  return client[method](...)
end
M.call = call

local function client_for(buf)
  local list = (vim.lsp.get_clients or vim.lsp.get_active_clients)()
  for _, c in pairs(list) do
    if c.name == M.options.client_name and vim.lsp.buf_is_attached(buf, c.id) then
      return c
    end
  end
  return nil
end

local function cursor(buf)
  local win = vim.fn.bufwinid(buf)
  if win == -1 then
    return nil
  end
  local pos = vim.api.nvim_win_get_cursor(win)
  return pos[1] - 1, pos[2], win
end

local function cancel_request(s)
  local r = s.request
  s.request = nil
  if r then
    local c = vim.lsp.get_client_by_id(r.client_id)
    if c and r.id then
      call(c, 'cancel_request', r.id)
    end
  end
end

local function stop_timer(s)
  if s.timer then
    s.timer:stop()
    s.timer:close()
    s.timer = nil
  end
end

--- Remove the ghost text; with `cancel`, also drop the pending request and debounce.
function M.clear(buf, cancel)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local s = buffers[buf]
  if not s then
    return
  end
  if vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_clear_namespace(buf, ns, 0, -1)
  end
  s.shown = nil
  if cancel then
    stop_timer(s)
    cancel_request(s)
  end
end

local function render(buf, sh)
  vim.api.nvim_buf_clear_namespace(buf, ns, 0, -1)
  local line = vim.api.nvim_buf_get_lines(buf, sh.row, sh.row + 1, true)[1]
  local overlay, virt = text.layout(sh.remaining, line, sh.col, sh.replace_end, vim.bo[buf].tabstop)
  local virt_lines = {}
  for _, l in ipairs(virt) do
    virt_lines[#virt_lines + 1] = { { l, 'KogGhostText' } }
  end
  sh.extmark = vim.api.nvim_buf_set_extmark(buf, ns, sh.row, sh.col, {
    virt_text = { { overlay, 'KogGhostText' } },
    virt_text_pos = 'overlay',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
    priority = 200,
  })
  sh.tick = vim.api.nvim_buf_get_changedtick(buf)
end

--- Show `item` (an LSP InlineCompletionItem) at the cursor if it still fits the text.
function M.show(buf, client, item)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local row, col = cursor(buf)
  if not row then
    return false
  end
  local line = vim.api.nvim_buf_get_lines(buf, row, row + 1, true)[1]
  local r = text.resolve(item, row, line, col, client.offset_encoding or 'utf-16')
  if not r then
    return false
  end
  local s = get(buf)
  s.shown = { client_id = client.id, item = item, remaining = r.text, row = row, col = col, replace_end = r.replace_end }
  render(buf, s.shown)
  vim.api.nvim_exec_autocmds('User', { pattern = 'KogGhostShown', modeline = false })
  return true
end

--- Send textDocument/inlineCompletion for the cursor position (newest wins).
function M.request(buf, trigger_kind)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local s = get(buf)
  stop_timer(s)
  cancel_request(s)
  local client = client_for(buf)
  local row, col = cursor(buf)
  if not client or not row then
    return false
  end
  local line = vim.api.nvim_buf_get_lines(buf, row, row + 1, true)[1]
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(buf) },
    position = { line = row, character = text.byte_to_char(line, col, client.offset_encoding or 'utf-16') },
    context = { triggerKind = trigger_kind or M.INVOKED },
  }
  local req = { client_id = client.id, tick = vim.api.nvim_buf_get_changedtick(buf), row = row, col = col }
  s.request = req
  local ok, id = call(client, 'request', 'textDocument/inlineCompletion', params, function(err, result)
    if s.request ~= req then
      return -- a newer request (or a clear) superseded this one
    end
    s.request = nil
    if err or not result or not vim.api.nvim_buf_is_valid(buf) then
      return
    end
    local r2, c2 = cursor(buf)
    if vim.api.nvim_buf_get_changedtick(buf) ~= req.tick or r2 ~= req.row or c2 ~= req.col then
      return -- the text or the cursor moved on while the server was working
    end
    if not vim.startswith(vim.api.nvim_get_mode().mode, 'i') then
      return
    end
    local items = result.items or result
    for _, item in ipairs(items) do
      if M.show(buf, client, item) then
        return
      end
    end
  end, buf)
  if ok then
    req.id = id
  else
    s.request = nil
  end
  return ok
end

--- Debounced automatic request, from TextChangedI.
function M.schedule(buf)
  local s = get(buf)
  stop_timer(s)
  if not M.options.enabled then
    return
  end
  s.timer = vim.loop.new_timer()
  s.timer:start(M.options.debounce_ms, 0, vim.schedule_wrap(function()
    stop_timer(s)
    if vim.api.nvim_buf_is_valid(buf) and buf == vim.api.nvim_get_current_buf()
      and vim.startswith(vim.api.nvim_get_mode().mode, 'i') then
      M.request(buf, M.AUTOMATIC)
    end
  end))
end

--- TextChangedI/TextChangedP: keep the suggestion while the user types into it, else ask anew.
function M.on_text_changed(buf)
  local s = get(buf)
  local tick = vim.api.nvim_buf_get_changedtick(buf)
  if s.own_tick == tick then
    return -- our own accept edit
  end
  local sh = s.shown
  if sh then
    local row, col = cursor(buf)
    if row == sh.row and col >= sh.col then
      local line = vim.api.nvim_buf_get_lines(buf, row, row + 1, true)[1]
      local typed = line:sub(sh.col + 1, col)
      local rest = text.consume_typed(sh.remaining, typed)
      if rest and rest ~= '' then
        sh.replace_end = sh.replace_end + #typed
        sh.remaining, sh.col = rest, col
        render(buf, sh)
        return
      end
    end
    M.clear(buf, false)
  end
  M.schedule(buf)
end

--- CursorMovedI: a cursor move without an edit dismisses the suggestion.
function M.on_cursor_moved(buf)
  local sh = buffers[buf] and buffers[buf].shown
  if not sh or vim.api.nvim_buf_get_changedtick(buf) ~= sh.tick then
    return -- edits are handled by on_text_changed
  end
  local row, col = cursor(buf)
  if row ~= sh.row or col ~= sh.col then
    M.clear(buf, true)
  end
end

function M.visible(buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  return buffers[buf] ~= nil and buffers[buf].shown ~= nil
end

--- The suggestion as it is drawn: { text, row, col } or nil (for tests and statuslines).
function M.current(buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local sh = buffers[buf] and buffers[buf].shown
  if not sh then
    return nil
  end
  return { text = sh.remaining, row = sh.row, col = sh.col, replace_end = sh.replace_end }
end

--- Accept the suggestion: kind = 'all' | 'word' | 'line'. Returns true if text was inserted.
function M.accept(kind, buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local s = buffers[buf]
  local sh = s and s.shown
  if not sh then
    return false
  end
  local chunk = sh.remaining
  if kind == 'word' then
    chunk = text.next_word(sh.remaining)
  elseif kind == 'line' then
    chunk = text.next_line(sh.remaining)
  end
  local plan = text.plan_accept(sh.remaining, chunk, sh.col, sh.replace_end)
  vim.api.nvim_buf_clear_namespace(buf, ns, 0, -1)
  vim.api.nvim_buf_set_text(buf, sh.row, sh.col, sh.row, plan.end_col, plan.lines)
  local row = sh.row + plan.cursor_row_delta
  local win = vim.fn.bufwinid(buf)
  if win ~= -1 then
    vim.api.nvim_win_set_cursor(win, { row + 1, plan.cursor_col })
  end
  s.own_tick = vim.api.nvim_buf_get_changedtick(buf)
  if plan.remaining == '' then
    s.shown = nil
    local item = sh.item
    local client = vim.lsp.get_client_by_id(sh.client_id)
    if client and item.command then
      -- kog.accepted (and any other item command) runs on the server after the insert.
      call(client, 'request', 'workspace/executeCommand', {
        command = item.command.command,
        arguments = item.command.arguments,
      }, function() end, buf)
    end
  else
    sh.remaining, sh.row, sh.col, sh.replace_end = plan.remaining, row, plan.cursor_col, plan.replace_end
    render(buf, sh)
  end
  return true
end

function M.detach(buf)
  M.clear(buf, true)
  buffers[buf] = nil
end

return M
