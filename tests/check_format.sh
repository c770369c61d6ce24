#!/bin/sh
# Every C file follows the project's .clang-format. Skipped (77) without clang-format.
root=${1:-.}
command -v clang-format >/dev/null 2>&1 || { echo "clang-format not installed: skipped"; exit 77; }
cd "$root" || exit 1
files=$(git ls-files '*.c' '*.h' 2>/dev/null)
[ -n "$files" ] || files=$(find include src replication recovery tests examples bench -name '*.[ch]')
out=$(clang-format --dry-run $files 2>&1 | grep "warning:" | cut -d: -f1 | sort -u)
if [ -n "$out" ]; then
    echo "not formatted with .clang-format (run clang-format -i on them):"
    echo "$out"
    exit 1
fi
echo "format: every C file follows .clang-format"
