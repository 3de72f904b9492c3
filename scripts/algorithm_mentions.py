#!/usr/bin/env python3
"""Per algorithm, the non-test source files outside its own module that name it in code.

    python3 scripts/algorithm_mentions.py [ROOT] [-v]

Prints each algorithm's count (with -v, the files); exits 1 when any algorithm is named in more
than four, the bound that keeps adding an algorithm to its module, its Lua file, its table entry
and a few exhaustive matches (see docs/ARCHITECTURE.md, "The path to add an algorithm").

Counts a file when, with comments and `#[cfg(test)]` modules removed, it holds the algorithm's
`Algorithm`/`Policy` variant or type name (`TokenBucket...`) or its rules name (`token_bucket`).
Left out: the algorithm's own module, Lua files, tests/, benches/, examples/, and test support
(the `sluice-test-support` and `sluice-testing` crates, `testing` modules behind the feature).
"""
import pathlib
import re
import sys

ALGORITHMS = {
    "token_bucket": "TokenBucket",
    "gcra": "Gcra",
    "leaky_queue": "LeakyQueue",
    "fixed_window": "FixedWindow",
    "sliding_log": "SlidingLog",
    "sliding_counter": "SlidingCounter",
    "bucketed_window": "BucketedWindow",
    "concurrency_limit": "ConcurrencyLimit",
}
SKIP_CRATES = {"sluice-test-support", "sluice-testing"}


def strip_comments(text):
    """The code without comments, and the same with string and char literals blanked."""
    out, shadow, i, n = [], [], 0, len(text)

    def literal(s):
        out.append(s)
        shadow.append(s[0] + " " * (len(s) - 2) + s[-1] if len(s) > 1 else s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            literal(text[i:end])
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            literal(text[i:j + 1])
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:])
            literal(text[i:i + len(m.group(0))])
            i += len(m.group(0))
        else:
            out.append(c)
            shadow.append(c)
            i += 1
    return "".join(out), "".join(shadow)


def strip_test_modules(text, shadow):
    """Removes each `#[cfg(test)]` item (a module block or a single item)."""
    pattern = re.compile(r"#\[cfg\((test|all\(test[^\]]*\))\)\]")
    while True:
        m = pattern.search(shadow)
        if not m:
            return text
        start = m.start()
        brace = shadow.find("{", m.end())
        semi = shadow.find(";", m.end())
        if semi >= 0 and (brace < 0 or semi < brace):
            end = semi + 1
        else:
            depth, j = 0, brace
            while j < len(shadow):
                if shadow[j] == "{":
                    depth += 1
                elif shadow[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            end = j + 1
        text = text[:start] + text[end:]
        shadow = shadow[:start] + shadow[end:]


def source_files(root):
    for path in sorted(root.glob("crates/*/src/**/*.rs")):
        parts = path.relative_to(root).parts
        if parts[1] in SKIP_CRATES or {"tests", "benches", "examples", "testing"} & set(parts[3:]):
            continue
        if path.name in ("testing.rs", "tests.rs"):
            continue
        yield path


def main():
    args = [a for a in sys.argv[1:] if a != "-v"]
    root = pathlib.Path(args[0] if args else ".")
    verbose = "-v" in sys.argv
    code = {p: strip_test_modules(*strip_comments(p.read_text())) for p in source_files(root)}
    worst = 0
    for snake, camel in ALGORITHMS.items():
        own = root / f"crates/sluice-core/src/algorithm/{snake}.rs"
        pattern = re.compile(rf"\b{camel}\w*|(?<![A-Za-z0-9]){snake}(?![A-Za-z0-9])")
        files = [p for p, text in code.items() if p != own and pattern.search(text)]
        worst = max(worst, len(files))
        print(f"{snake:16} {len(files)}")
        if verbose:
            for p in files:
                print(f"    {p.relative_to(root)}")
    return 0 if worst <= 4 else 1


if __name__ == "__main__":
    sys.exit(main())
