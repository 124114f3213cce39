"""Reading back what the PowerShell export writes (a pasted command, never run): PowerShell's words
(single quotes with ``''`` doubled, ``"..."`` with backtick escapes, bare words) and, for a command in
the ``$PSNativeCommandArgumentPassing = 'Legacy'`` block, the arguments the program then receives
(PowerShell's legacy command line read with ``CommandLineToArgvW``'s rules)."""

from __future__ import annotations

#: Characters PowerShell takes as a single quote (and reads doubled as one).
PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
#: Characters PowerShell takes as a double quote.
PS_DOUBLE_QUOTES = '"\u201c\u201d\u201e'
_PS_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "e": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
               "v": "\v"}


def _single(text: str, i: int, buf: list[str]) -> int:
    """Read a single-quoted string starting after its quote at ``i``; returns the index after it."""
    while i < len(text):
        ch = text[i]
        if ch in PS_SINGLE_QUOTES:
            if i + 1 < len(text) and text[i + 1] in PS_SINGLE_QUOTES:
                buf.append(ch)
                i += 2
                continue
            return i + 1
        buf.append(ch)
        i += 1
    raise ValueError("a single-quoted string is not closed")


def _double(text: str, i: int, buf: list[str]) -> int:
    """Read a double-quoted string (backtick escapes, ``""`` as one; ``$`` kept as written)."""
    while i < len(text):
        ch = text[i]
        if ch == "`" and i + 1 < len(text):
            buf.append(_PS_ESCAPES.get(text[i + 1], text[i + 1]))
            i += 2
        elif ch in PS_DOUBLE_QUOTES:
            if i + 1 < len(text) and text[i + 1] in PS_DOUBLE_QUOTES:
                buf.append('"')
                i += 2
                continue
            return i + 1
        else:
            buf.append(ch)
            i += 1
    raise ValueError("a double-quoted string is not closed")


def powershell_words(text: str) -> list[str]:
    """The words of one PowerShell command line (no variables expanded). Raises ValueError for an
    unclosed quote."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        buf: list[str] = []
        while i < n and not text[i].isspace():
            ch = text[i]
            if ch in PS_SINGLE_QUOTES:
                i = _single(text, i + 1, buf)
            elif ch in PS_DOUBLE_QUOTES:
                i = _double(text, i + 1, buf)
            elif ch == "`" and i + 1 < n:
                buf.append(text[i + 1])
                i += 2
            else:
                buf.append(ch)
                i += 1
        words.append("".join(buf))
    return words


def need_quotes(arg: str) -> bool:
    """PowerShell's legacy ``NeedQuotes`` (NativeCommandParameterBinder.cs): whitespace outside its
    count of double quotes, where a quote right after a backslash is not counted."""
    count, after_backslash = 0, False
    for ch in arg:
        if ch == '"' and not after_backslash:
            count += 1
        elif ch.isspace() and count % 2 == 0:
            return True
        after_backslash = ch == "\\"
    return False


def legacy_line(args: list[str]) -> str:
    """The command line Windows PowerShell 5.1 builds from ``args``: an empty one dropped, one that
    needs quotes wrapped in ``"``."""
    return " ".join(f'"{a}"' if need_quotes(a) else a for a in args if a)


def msvcrt_split(line: str) -> list[str]:
    """``CommandLineToArgvW``'s reading of the arguments after the program: 2n backslashes and a quote
    give n backslashes and toggle quoting, 2n+1 give n and a literal quote; ``""`` inside quotes is
    one quote."""
    args: list[str] = []
    cur: list[str] = []
    in_quotes = started = False
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch in " \t" and not in_quotes:
            if started:
                args.append("".join(cur))
            cur, started = [], False
            i += 1
            continue
        started = True
        if ch == "\\":
            j = i
            while j < n and line[j] == "\\":
                j += 1
            slashes = j - i
            if j < n and line[j] == '"':
                cur.append("\\" * (slashes // 2))
                if slashes % 2:
                    cur.append('"')
                    j += 1
            else:
                cur.append("\\" * slashes)
            i = j
            continue
        if ch == '"':
            if in_quotes and i + 1 < n and line[i + 1] == '"':
                cur.append('"')
                i += 2
                continue
            in_quotes = not in_quotes
        else:
            cur.append(ch)
        i += 1
    if started:
        args.append("".join(cur))
    return args
