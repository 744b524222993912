-- Pure text helpers for ghost text: position encodings, snippet text, partial accepts
-- (word / line), what to draw and what to insert. No editor state, so they are unit-tested
-- headless (tests/text_spec.lua). Columns are 0-based byte offsets into a line.
local M = {}

-- Neovim 0.11 changed str_byteindex/str_utfindex to take the encoding name.
local new_index_api = vim.fn.has('nvim-0.11') == 1

--- Byte column of an LSP `character` offset in `line` for the client's encoding.
function M.char_to_byte(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if new_index_api then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ok, col = pcall(vim.str_byteindex, line, character, encoding ~= 'utf-32')
  end
  if ok then
    return col
  end
  return #line -- past the end: clamp, as the spec says for positions beyond the line
end

--- LSP `character` offset of byte column `col` in `line` for the client's encoding.
function M.byte_to_char(line, col, encoding)
  if encoding == 'utf-8' then
    return col
  end
  if new_index_api then
    return vim.str_utfindex(line, encoding, col, false)
  end
  local utf32, utf16 = vim.str_utfindex(line, col)
  if encoding == 'utf-32' then
    return utf32
  end
  return utf16
end

--- Plain text of an InlineCompletionItem's insertText (string or StringValue snippet).
-- Snippet placeholders keep their default text; tab stops and escapes are dropped.
function M.insert_text(insert_text)
  if type(insert_text) == 'string' then
    return insert_text
  end
  if type(insert_text) ~= 'table' or type(insert_text.value) ~= 'string' then
    return nil
  end
  local s = insert_text.value
  -- ${1:default} -> default (repeat for nesting), ${1} / $1 / $0 -> ''
  local prev
  repeat
    prev = s
    s = s:gsub('%${%d+:([^{}]*)}', '%1')
  until s == prev
  s = s:gsub('%${%d+}', ''):gsub('%$%d+', '')
  s = s:gsub('\\([%$}\\])', '%1')
  return s
end

--- Resolve an item against the current line and cursor.
-- Returns { text = what is still to insert at the cursor, replace_end = byte column on the
-- cursor line up to which existing text is replaced on accept (>= cursor col) } or nil when
-- the item does not extend what is already typed (the editor must not show it then).
function M.resolve(item, row, line, col, encoding)
  local text = M.insert_text(item.insertText)
  if not text then
    return nil
  end
  local start_b, end_b = col, col
  if item.range then
    local rs, re = item.range.start, item.range['end']
    if rs.line ~= row or re.line ~= row then
      return nil -- only single-line ranges on the cursor line (LSP: "should be a single line")
    end
    start_b = M.char_to_byte(line, rs.character, encoding)
    end_b = M.char_to_byte(line, re.character, encoding)
    if start_b > col then
      return nil
    end
  end
  local typed = line:sub(start_b + 1, col)
  if text:sub(1, #typed) ~= typed then
    return nil
  end
  local rest = text:sub(#typed + 1)
  if rest == '' then
    return nil
  end
  return { text = rest, replace_end = math.max(end_b, col) }
end

--- The next word of a suggestion, for "accept word": leading blanks plus one run of word
-- characters (bytes >= 0x80 count as word characters, so UTF-8 is never split) or one run
-- of punctuation; at a line break the break plus the next line's indentation.
function M.next_word(s)
  if s == '' then
    return ''
  end
  if s:sub(1, 1) == '\n' then
    return s:match('^\n[ \t]*')
  end
  return s:match('^[ \t]*[%w_\128-\255]+') or s:match('^[ \t]*[^%w_%s\128-\255]+') or s:match('^%s+') or s
end

--- The next line of a suggestion, for "accept line": up to (not including) the next line
-- break; at a line break, the break plus the whole following line.
function M.next_line(s)
  if s == '' then
    return ''
  end
  if s:sub(1, 1) == '\n' then
    return '\n' .. (s:sub(2):match('^[^\n]*'))
  end
  return s:match('^[^\n]*')
end

--- Remaining suggestion after the user typed `typed` at the cursor, or nil if it diverged.
function M.consume_typed(remaining, typed)
  if typed == '' then
    return remaining
  end
  if remaining:sub(1, #typed) == typed then
    return remaining:sub(#typed + 1)
  end
  return nil
end

local function expand_tabs(s, tabstop)
  return (s:gsub('\t', string.rep(' ', tabstop)))
end

--- What to draw. `line` is the cursor line, `col` the cursor byte column.
-- Returns overlay (string drawn over the cursor position to the end of the line, padded so
-- that replaced text is hidden) and virt_lines (list of strings drawn below the line):
-- together they show the text exactly as it will be after accepting.
function M.layout(text, line, col, replace_end, tabstop, width)
  width = width or vim.api.nvim_strwidth
  tabstop = tabstop or 8
  local lines = vim.split(text, '\n', { plain = true })
  local after = line:sub(col + 1) -- existing text from the cursor on (hidden by the overlay)
  local tail = line:sub(replace_end + 1) -- existing text that survives, after the insertion
  lines[#lines] = lines[#lines] .. tail
  local overlay = expand_tabs(lines[1], tabstop)
  local cover = width(expand_tabs(after, tabstop))
  local w = width(overlay)
  if w < cover then
    overlay = overlay .. string.rep(' ', cover - w)
  end
  local virt = {}
  for i = 2, #lines do
    virt[#virt + 1] = expand_tabs(lines[i], tabstop)
  end
  return overlay, virt
end

--- Plan the buffer edit for accepting `chunk` (a prefix of `remaining`) at byte `col`.
-- Full accept replaces up to `replace_end`; a partial accept only inserts, keeping the
-- to-be-replaced text after the cursor so the rest of the suggestion still applies.
-- Returns { lines, end_col (exclusive byte col of the replaced span on the cursor row),
-- cursor_row_delta, cursor_col, remaining, replace_end (on the new cursor row) }.
function M.plan_accept(remaining, chunk, col, replace_end)
  assert(remaining:sub(1, #chunk) == chunk, 'chunk must be a prefix of the suggestion')
  local full = #chunk == #remaining
  local lines = vim.split(chunk, '\n', { plain = true })
  local new_col = (#lines == 1 and col or 0) + #lines[#lines]
  return {
    lines = lines,
    end_col = full and replace_end or col,
    cursor_row_delta = #lines - 1,
    cursor_col = new_col,
    remaining = remaining:sub(#chunk + 1),
    replace_end = new_col + (replace_end - col),
  }
end

return M
