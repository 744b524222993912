-- Unit tests for kog.text (pure functions) and kog.ghost drawing/accepting in a scratch buffer.
local text = require('kog.text')

it('utf-16 and utf-32 offsets map to bytes and back (astral chars are 2 utf-16 units)', function()
  local line = 'a😀b é' -- bytes: a(1) 😀(4) b(1) space(1) é(2)
  eq(5, text.char_to_byte(line, 3, 'utf-16'), 'after the emoji, utf-16')
  eq(5, text.char_to_byte(line, 2, 'utf-32'), 'after the emoji, utf-32')
  eq(3, text.char_to_byte(line, 3, 'utf-8'), 'utf-8 passthrough')
  eq(#line, text.char_to_byte(line, 99, 'utf-16'), 'clamped past the end')
  eq(3, text.byte_to_char(line, 5, 'utf-16'), 'byte -> utf-16')
  eq(2, text.byte_to_char(line, 5, 'utf-32'), 'byte -> utf-32')
  eq(6, text.byte_to_char(line, 9, 'utf-16'), 'end -> utf-16')
end)

it('snippet insertText keeps placeholder text and drops tab stops', function()
  eq('foo(bar)', text.insert_text('foo(bar)'))
  eq('foo(x, y)', text.insert_text({ kind = 'snippet', value = 'foo(${1:x}, ${2:y})$0' }))
  eq('a$b', text.insert_text({ kind = 'snippet', value = 'a\\$b${1}' }))
  eq(nil, text.insert_text(nil))
end)

it('resolve: plain insertion at the cursor', function()
  local r = text.resolve({ insertText = 'return x' }, 3, '    ', 4, 'utf-16')
  eq({ text = 'return x', replace_end = 4 }, r)
end)

it('resolve: a range that starts before the cursor must extend what is typed', function()
  local item = { insertText = 'print(x)', range = { start = { line = 0, character = 4 }, ['end'] = { line = 0, character = 7 } } }
  eq({ text = 'nt(x)', replace_end = 7 }, text.resolve(item, 0, '    pri', 7, 'utf-16'))
  eq(nil, text.resolve(item, 0, '    pra', 7, 'utf-16'), 'diverged')
  local other_row = { insertText = 'x', range = { start = { line = 1, character = 0 }, ['end'] = { line = 1, character = 0 } } }
  eq(nil, text.resolve(other_row, 0, '', 0, 'utf-16'), 'range on another line')
  eq(nil, text.resolve({ insertText = '' }, 0, '', 0, 'utf-16'), 'empty suggestion')
end)

it('resolve: a range that replaces text after the cursor (closing bracket)', function()
  local line = 'foo(😀'
  -- cursor after the emoji (byte 8 = utf-16 6); the range replaces the ")" the editor auto-inserted
  local item = { insertText = 'a, b)', range = { start = { line = 2, character = 6 }, ['end'] = { line = 2, character = 7 } } }
  eq({ text = 'a, b)', replace_end = 9 }, text.resolve(item, 2, line .. ')', 8, 'utf-16'))
end)

it('next_word and next_line split suggestions for partial accept', function()
  eq('foo', text.next_word('foo(bar)'))
  eq('(', text.next_word('(bar)'), 'punctuation run stops at a word')
  eq(' bar', text.next_word(' bar baz'))
  eq('):', text.next_word('):\n    pass'))
  eq('\n    ', text.next_word('\n    pass'))
  eq('héllo', text.next_word('héllo wörld'), 'UTF-8 letters stay whole')
  eq('x = 1', text.next_line('x = 1\ny = 2'))
  eq('\ny = 2', text.next_line('\ny = 2\nz'))
  eq('', text.next_line(''))
end)

it('consume_typed keeps the suggestion while typing into it', function()
  eq('turn x', text.consume_typed('return x', 're'))
  eq(nil, text.consume_typed('return x', 'ra'))
  eq('return x', text.consume_typed('return x', ''))
end)

it('layout draws the text as it will be after accepting', function()
  local overlay, virt = text.layout('x + 1', 'y = ', 4, 4, 8)
  eq('x + 1', overlay)
  eq({}, virt)
  -- replacing ")" after the cursor: the overlay covers it, surviving tail is appended
  overlay = text.layout('a)', 'f()  # c', 2, 3, 8)
  eq('a)  # c', overlay)
  -- shorter suggestion than the replaced text: padded so nothing stale shows through
  overlay = text.layout('1', 'x = ()))', 4, 8, 8)
  eq('1   ', overlay)
  -- multi-line: first line overlay, the rest (plus the tail) as virtual lines; tabs expanded
  overlay, virt = text.layout('):\n\treturn 1', 'def f(', 6, 6, 4)
  eq('):', overlay)
  eq({ '    return 1' }, virt)
end)

it('plan_accept: full, word and multi-line partial accepts', function()
  local p = text.plan_accept('x + 1', 'x + 1', 4, 4)
  eq({ lines = { 'x + 1' }, end_col = 4, cursor_row_delta = 0, cursor_col = 9, remaining = '', replace_end = 9 }, p)
  p = text.plan_accept('a, b)', 'a', 4, 5) -- partial: insert only, keep the ")" to replace later
  eq(4, p.end_col)
  eq(5, p.cursor_col)
  eq(', b)', p.remaining)
  eq(6, p.replace_end)
  p = text.plan_accept('):\n    return 1', '):\n    return 1', 6, 6)
  eq({ '):', '    return 1' }, p.lines)
  eq(1, p.cursor_row_delta)
  eq(12, p.cursor_col)
  local ok = pcall(text.plan_accept, 'abc', 'x', 0, 0)
  eq(false, ok, 'chunk must be a prefix')
end)

-- kog.ghost against a real buffer with a fake LSP client object (no server needed).
local ghost = require('kog.ghost')
-- Headless tests stay in Normal mode, where the cursor cannot sit after the last character
-- as it does while typing in Insert mode; 'onemore' allows that position.
vim.o.virtualedit = 'onemore'

local function scratch(lines, row, col)
  vim.cmd('enew!')
  local buf = vim.api.nvim_get_current_buf()
  vim.bo[buf].buftype = 'nofile'
  vim.api.nvim_buf_set_lines(buf, 0, -1, true, lines)
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  return buf
end

local function extmark_text(buf)
  local marks = vim.api.nvim_buf_get_extmarks(buf, ghost.namespace, 0, -1, { details = true })
  local out = {}
  for _, m in ipairs(marks) do
    local d = m[4]
    out[#out + 1] = { row = m[2], col = m[3], overlay = d.virt_text[1][1], lines = vim.tbl_map(function(l)
      return l[1][1]
    end, d.virt_lines or {}) }
  end
  return out
end

local fake = { id = 9999, offset_encoding = 'utf-16' }

it('ghost.show draws overlay + virt_lines and accept inserts exactly that text', function()
  local buf = scratch({ 'def add(a, b):', '    ', 'x = 1' }, 1, 4)
  eq(true, ghost.show(buf, fake, { insertText = 'return a + b\n    # done' }))
  eq({ { row = 1, col = 4, overlay = 'return a + b', lines = { '    # done' } } }, extmark_text(buf))
  eq(true, ghost.accept('all', buf))
  eq({ 'def add(a, b):', '    return a + b', '    # done', 'x = 1' }, vim.api.nvim_buf_get_lines(buf, 0, -1, true))
  eq({ 3, 10 }, vim.api.nvim_win_get_cursor(0), 'cursor at the end of the insertion')
  eq({}, extmark_text(buf))
  eq(false, ghost.visible(buf))
end)

it('ghost accept word / line keep the rest of the suggestion shown', function()
  local buf = scratch({ 'total = ' }, 0, 8)
  ghost.show(buf, fake, { insertText = 'sum(xs)\nprint(total)' })
  ghost.accept('word', buf)
  eq({ 'total = sum' }, vim.api.nvim_buf_get_lines(buf, 0, -1, true))
  eq('(xs)\nprint(total)', ghost.current(buf).text)
  ghost.accept('line', buf)
  eq({ 'total = sum(xs)' }, vim.api.nvim_buf_get_lines(buf, 0, -1, true))
  ghost.accept('line', buf)
  eq({ 'total = sum(xs)', 'print(total)' }, vim.api.nvim_buf_get_lines(buf, 0, -1, true))
  eq(false, ghost.visible(buf))
end)

it('ghost keeps the suggestion while typing into it and drops it on divergence', function()
  local buf = scratch({ 'x = ' }, 0, 4)
  ghost.show(buf, fake, { insertText = 'len(items)' })
  vim.api.nvim_buf_set_text(buf, 0, 4, 0, 4, { 'le' })
  vim.api.nvim_win_set_cursor(0, { 1, 6 })
  ghost.on_text_changed(buf)
  eq('n(items)', ghost.current(buf).text)
  eq({ { row = 0, col = 6, overlay = 'n(items)', lines = {} } }, extmark_text(buf))
  vim.api.nvim_buf_set_text(buf, 0, 6, 0, 6, { 'q' })
  vim.api.nvim_win_set_cursor(0, { 1, 7 })
  ghost.on_text_changed(buf)
  eq(false, ghost.visible(buf))
  ghost.clear(buf, true)
end)

it('ghost replaces the auto-inserted closing bracket on accept', function()
  local buf = scratch({ 'print()' }, 0, 6)
  local item = { insertText = '"hi")', range = { start = { line = 0, character = 6 }, ['end'] = { line = 0, character = 7 } } }
  ghost.show(buf, fake, item)
  eq('"hi")', extmark_text(buf)[1].overlay)
  ghost.accept('all', buf)
  eq({ 'print("hi")' }, vim.api.nvim_buf_get_lines(buf, 0, -1, true))
end)

it('a cursor move without an edit dismisses the suggestion', function()
  local buf = scratch({ 'abc', '' }, 1, 0)
  ghost.show(buf, fake, { insertText = 'def' })
  vim.api.nvim_win_set_cursor(0, { 1, 1 })
  ghost.on_cursor_moved(buf)
  eq(false, ghost.visible(buf))
end)
