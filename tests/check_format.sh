#!/bin/sh
# Every C file follows the project's .clang-format, and no file holds a merge-conflict marker
# (one reached the README once). Skipped (77) without clang-format.
root=${1:-.}
cd "$root" || exit 1
marks=$(grep -rnE '^(<<<<<<<|>>>>>>>)( |$)' --include='*.md' --include='*.[ch]' --include='*.sh' \
        --include='*.py' --include='*.txt' --include='*.cmake' --exclude-dir=build --exclude-dir=.git . )
if [ -n "$marks" ]; then
    echo "merge-conflict markers left in:"
    echo "$marks"
    exit 1
fi
command -v clang-format >/dev/null 2>&1 || { echo "clang-format not installed: skipped"; exit 77; }
files=$(git ls-files '*.c' '*.h' 2>/dev/null)
[ -n "$files" ] || files=$(find include src replication recovery tests examples bench -name '*.[ch]')
out=$(clang-format --dry-run $files 2>&1 | grep "warning:" | cut -d: -f1 | sort -u)
if [ -n "$out" ]; then
    echo "not formatted with .clang-format (run clang-format -i on them):"
    echo "$out"
    exit 1
fi
echo "format: every C file follows .clang-format"
