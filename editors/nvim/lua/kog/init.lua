-- kog: Neovim client for kog-lsp (local-model inline completion, review diagnostics,
-- refactoring code actions).
--   require('kog').setup({ model = 'default', device = 'auto', settings = { maxTokens = 64 } })
-- Starts the server with vim.lsp.start (>= 0.8) or vim.lsp.start_client (0.7); ghost text
-- comes from vim.lsp.inline_completion on 0.12+, else from kog.ghost (extmarks).
-- Diagnostics and code actions use the built-in client (vim.diagnostic, vim.lsp.buf.code_action).
local ghost = require('kog.ghost')

local M = {}

local defaults = {
  cmd = nil, -- full server command; default: { python, '-m', 'kog_lsp', '--stdio', ... }
  python = 'python3',
  model = 'default',
  device = 'auto',
  backend = 'auto',
  extra_args = {},
  filetypes = { 'python' }, -- filetypes served; '*': every file buffer (other languages need a bigger model)
  root_dir = nil, -- default: the current working directory
  settings = {}, -- server settings (docs: enable, debounceMs, maxTokens, multiline, ...)
  ghost = 'auto', -- 'auto' (native on 0.12+), 'native', 'extmark'
  debounce_ms = 30, -- client-side wait before an automatic request (extmark mode)
  keymaps = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-Down>',
    dismiss = '<C-]>',
    trigger = '<M-\\>',
  },
  on_attach = nil,
}

M.config = vim.deepcopy(defaults)
M.status = { state = 'stopped' }
local client_id -- 0.7 path: one client shared by all buffers
local group

local has_native = function()
  return vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
end

function M.use_native()
  if M.config.ghost == 'native' then
    return has_native()
  end
  return M.config.ghost == 'auto' and has_native()
end

function M.server_cmd()
  local c = M.config
  if c.cmd then
    return c.cmd
  end
  local cmd = { c.python, '-m', 'kog_lsp', '--stdio', '--model', c.model, '--device', c.device, '--backend', c.backend }
  vim.list_extend(cmd, c.extra_args or {})
  return cmd
end

local function server_settings()
  local s = vim.deepcopy(M.config.settings or {})
  if s.enable == nil then
    s.enable = true
  end
  return s
end

--- Text for a statusline: "kog ready graph 42ms 180tok/s".
function M.statusline()
  local st = M.status
  local parts = { 'kog', st.state or '?' }
  if st.state == 'ready' and not ghost.options.enabled then
    parts[2] = 'off'
  end
  if st.backend and st.backend ~= vim.NIL then
    parts[#parts + 1] = st.backend
  end
  if type(st.lastLatencyMs) == 'number' then
    parts[#parts + 1] = string.format('%dms', math.floor(st.lastLatencyMs + 0.5))
  end
  if type(st.tokPerS) == 'number' then
    parts[#parts + 1] = string.format('%.0ftok/s', st.tokPerS)
  end
  return table.concat(parts, ' ')
end

local function on_status(_, result)
  if type(result) == 'table' then
    M.status = result
    vim.g.kog_status = M.statusline()
    vim.api.nvim_exec_autocmds('User', { pattern = 'KogStatus', modeline = false })
  end
end

local function lsp_config()
  local c = M.config
  return {
    name = 'kog',
    cmd = M.server_cmd(),
    root_dir = c.root_dir or vim.loop.cwd(),
    init_options = server_settings(),
    settings = { kog = server_settings() },
    handlers = { ['kog/status'] = on_status },
    flags = { debounce_text_changes = 50 },
    on_attach = function(client, buf)
      if M.use_native() then
        vim.lsp.inline_completion.enable(true, { bufnr = buf })
      end
      if c.on_attach then
        c.on_attach(client, buf)
      end
    end,
    on_exit = function(code, _, id)
      vim.schedule(function()
        local live = M.client()
        if live and live.id ~= id then
          return -- a restart already started the next server; its status stands
        end
        M.status = { state = code == 0 and 'stopped' or 'error', message = 'kog-lsp exited with code ' .. code }
        vim.g.kog_status = M.statusline()
      end)
    end,
  }
end

--- Whether buffer `buf` gets the server: its filetype is in config.filetypes, or the list holds '*' and it is a file
-- buffer (buftype ''; not help, quickfix, terminal or prompt buffers, which have filetypes too).
function M.serves(buf)
  local ft = vim.bo[buf].filetype
  if ft == '' then
    return false
  end
  if vim.tbl_contains(M.config.filetypes, ft) then
    return true
  end
  return vim.tbl_contains(M.config.filetypes, '*') and vim.bo[buf].buftype == ''
end

--- Attach the kog server to `buf` (starting it if needed).
function M.attach(buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  if vim.lsp.start then
    return vim.lsp.start(lsp_config(), { bufnr = buf })
  end
  if not client_id or not vim.lsp.get_client_by_id(client_id) then
    client_id = vim.lsp.start_client(lsp_config())
    M.status = { state = 'loading' }
  end
  if client_id then
    vim.lsp.buf_attach_client(buf, client_id)
  end
  return client_id
end

function M.client()
  local list = (vim.lsp.get_clients or vim.lsp.get_active_clients)()
  for _, c in pairs(list) do
    if c.name == 'kog' and not ghost.call(c, 'is_stopped') then
      return c
    end
  end
  return nil
end

local function client_listed(id)
  for _, c in pairs((vim.lsp.get_clients or vim.lsp.get_active_clients)()) do
    if c.id == id then
      return true
    end
  end
  return false
end

local function notify_settings()
  local c = M.client()
  if c then
    c.config.settings = { kog = server_settings() }
    ghost.call(c, 'notify', 'workspace/didChangeConfiguration', { settings = c.config.settings })
  end
end

--- Turn automatic suggestions on/off (the trigger key works either way).
function M.toggle(on)
  if on == nil then
    on = not ghost.options.enabled
  end
  ghost.options.enabled = on
  M.config.settings.enable = on
  if not on then
    ghost.clear(0, true)
  end
  if M.use_native() then
    for _, buf in ipairs(vim.api.nvim_list_bufs()) do
      if vim.lsp.buf_is_attached(buf, (M.client() or {}).id or -1) then
        vim.lsp.inline_completion.enable(on, { bufnr = buf })
      end
    end
  end
  notify_settings()
  vim.g.kog_status = M.statusline()
  return on
end

function M.trigger()
  if M.use_native() then
    if vim.lsp.inline_completion.get then
      vim.lsp.inline_completion.get()
    end
    return
  end
  ghost.request(0, ghost.INVOKED)
end

function M.restart()
  local c = M.client()
  local bufs = {}
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    if c and vim.lsp.buf_is_attached(buf, c.id) then
      bufs[#bufs + 1] = buf
    end
  end
  if c then
    ghost.call(c, 'stop')
  end
  client_id = nil
  M.status = { state = 'loading', message = 'restarting kog-lsp' }
  vim.g.kog_status = M.statusline()
  -- Attach once the old client is gone (up to 5 s): vim.lsp.start would otherwise reuse it.
  local old_id, tries = c and c.id, 0
  local function reattach()
    tries = tries + 1
    if old_id and client_listed(old_id) and tries < 50 then
      vim.defer_fn(reattach, 100)
      return
    end
    for _, buf in ipairs(bufs) do
      M.attach(buf)
    end
  end
  vim.defer_fn(reattach, 100)
end

--- kog/stats as lines of text (shown by :KogStats).
function M.format_stats(st)
  local lat = st.latencyMs or {}
  local function n(v, fmt)
    return type(v) == 'number' and string.format(fmt, v) or '-'
  end
  local lines = {
    'kog-lsp statistics',
    '  latency p50 / p95: ' .. n(lat.p50, '%.1f') .. ' / ' .. n(lat.p95, '%.1f') .. ' ms (' .. n(lat.count, '%d') .. ' samples)',
    '  decode speed: ' .. n(st.tokPerS, '%.1f') .. ' tok/s',
    '  prefix cache hit rate: ' .. (type(st.prefixCacheHitRate) == 'number' and string.format('%.1f %%', st.prefixCacheHitRate * 100) or '-'),
    '  completions: ' .. n(st.completions, '%d') .. ', cancellations: ' .. n(st.cancellations, '%d') .. ', cache hits: ' .. n(st.cacheHits, '%d'),
  }
  if type(st.engine) == 'table' then
    lines[#lines + 1] = '  engine: ' .. vim.inspect(st.engine, { newline = ' ', indent = '' })
  end
  return lines
end

function M.stats(cb)
  local c = M.client()
  if not c then
    vim.notify('kog-lsp is not running', vim.log.levels.WARN)
    return
  end
  ghost.call(c, 'request', 'kog/stats', vim.empty_dict(), function(err, result)
    if err then
      vim.notify('kog/stats: ' .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
    elseif cb then
      cb(result)
    else
      vim.notify(table.concat(M.format_stats(result), '\n'), vim.log.levels.INFO)
    end
  end, vim.api.nvim_get_current_buf())
end

-- Insert-mode keys that act only when a suggestion is shown and the completion menu is
-- closed; otherwise they do what the key did before (a previous mapping or the key itself).
local function fallback(prev, lhs)
  if not prev or vim.tbl_isempty(prev) then
    return lhs
  end
  if type(prev.callback) == 'function' then
    local r = prev.callback()
    return prev.expr == 1 and (r or '') or ''
  end
  local rhs = prev.expr == 1 and vim.api.nvim_eval(prev.rhs) or prev.rhs
  if prev.noremap == 0 then
    vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(rhs, true, false, true), 'm', false)
    return ''
  end
  return rhs
end

-- The insert-mode mapping `lhs` had before setup(), or nil. maparg() gives a Lua callback
-- as a number on 0.7, so the function itself is looked up with nvim_get_keymap().
local function previous_mapping(lhs)
  local prev = vim.fn.maparg(lhs, 'i', false, true)
  if vim.tbl_isempty(prev) or (prev.desc and prev.desc:match('^kog:')) then
    return nil -- none, or our own mapping from an earlier setup()
  end
  if prev.callback ~= nil and type(prev.callback) ~= 'function' then
    for _, m in ipairs(vim.api.nvim_get_keymap('i')) do
      if m.lhs == prev.lhs and type(m.callback) == 'function' then
        prev.callback = m.callback
      end
    end
  end
  return prev
end

local function map_accept(lhs, kind)
  if not lhs then
    return
  end
  local prev = previous_mapping(lhs)
  vim.keymap.set('i', lhs, function()
    if vim.fn.pumvisible() == 1 then
      return fallback(prev, lhs)
    end
    if M.use_native() then
      if kind == 'all' and vim.lsp.inline_completion.get() then
        return ''
      end
      return fallback(prev, lhs)
    end
    if ghost.visible(0) then
      return string.format("<Cmd>lua require('kog.ghost').accept('%s')<CR>", kind)
    end
    return fallback(prev, lhs)
  end, { expr = true, silent = true, desc = 'kog: accept ' .. kind })
end

local function set_keymaps(k)
  map_accept(k.accept, 'all')
  map_accept(k.accept_word, 'word')
  map_accept(k.accept_line, 'line')
  if k.dismiss then
    local prev = previous_mapping(k.dismiss)
    vim.keymap.set('i', k.dismiss, function()
      if not M.use_native() and ghost.visible(0) then
        return "<Cmd>lua require('kog.ghost').clear(0, true)<CR>"
      end
      return fallback(prev, k.dismiss)
    end, { expr = true, silent = true, desc = 'kog: dismiss' })
  end
  if k.trigger then
    vim.keymap.set('i', k.trigger, M.trigger, { silent = true, desc = 'kog: trigger' })
  end
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(defaults), opts or {})
  if opts and opts.keymaps == false then
    M.config.keymaps = {}
  end
  ghost.options.debounce_ms = M.config.debounce_ms
  ghost.options.enabled = M.config.settings.enable ~= false
  vim.api.nvim_set_hl(0, 'KogGhostText', { link = 'Comment', default = true })
  set_keymaps(M.config.keymaps)

  group = vim.api.nvim_create_augroup('kog', { clear = true })
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = M.config.filetypes,
    callback = function(ev)
      if M.serves(ev.buf) then
        M.attach(ev.buf)
      end
    end,
  })
  if not M.use_native() then
    vim.api.nvim_create_autocmd({ 'TextChangedI', 'TextChangedP' }, {
      group = group,
      callback = function(ev)
        if M.client() and vim.lsp.buf_is_attached(ev.buf, M.client().id) then
          ghost.on_text_changed(ev.buf)
        end
      end,
    })
    vim.api.nvim_create_autocmd('CursorMovedI', {
      group = group,
      callback = function(ev)
        ghost.on_cursor_moved(ev.buf)
      end,
    })
    vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
      group = group,
      callback = function(ev)
        ghost.clear(ev.buf, true)
      end,
    })
    vim.api.nvim_create_autocmd('BufUnload', {
      group = group,
      callback = function(ev)
        ghost.detach(ev.buf)
      end,
    })
  end

  local cmd = vim.api.nvim_create_user_command
  cmd('KogTrigger', M.trigger, { desc = 'kog: request a suggestion' })
  cmd('KogToggle', function()
    vim.notify('kog: automatic suggestions ' .. (M.toggle() and 'on' or 'off'))
  end, { desc = 'kog: toggle automatic suggestions' })
  cmd('KogRestart', M.restart, { desc = 'kog: restart the server' })
  cmd('KogStats', function()
    M.stats()
  end, { desc = 'kog: show server statistics' })
  cmd('KogStatus', function()
    vim.notify(M.statusline())
  end, { desc = 'kog: show server status' })

  -- Buffers that were already open before setup().
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(buf) and M.serves(buf) then
      M.attach(buf)
    end
  end
end

return M
