#!/bin/sh
# Every environment variable the C sources name is documented: in docs/running.md's table (its
# meaning and default) and, when the library reads it (anything outside src/cli, the command
# line tool), in the Caveats list of include/chainps/chainps.h. A variable is a string literal's
# CHAINPS_/DMLC_/MS_/PS_ word, or the argument of a getenv() call. Fails listing what is missing.
root=${1:-.}
doc=$root/docs/running.md
hdr=$root/include/chainps/chainps.h
for f in "$doc" "$hdr"; do
  [ -r "$f" ] || { echo "env-doc: cannot read $f"; exit 1; }
done

# names FILES...: the variables the files name, one a line.
names() {
  {
    grep -ohE '"([^"\\]|\\.)*"' "$@" | grep -oE '\b(CHAINPS|DMLC|MS|PS)_[A-Z0-9_]*[A-Z0-9]\b'
    grep -ohE 'getenv\("[A-Za-z0-9_]+"\)' "$@" | sed -E 's/getenv\("([^"]*)"\)/\1/'
  } | sort -u
}

# where VAR FILES...: the first files naming VAR, for the message.
where() {
  v=$1
  shift
  grep -lw -- "$v" "$@" | head -3 | paste -sd' ' -
}

srcs=$(find "$root/src" "$root/replication" "$root/recovery" -name '*.[ch]' 2>/dev/null)
lib=$(printf '%s\n' $srcs | grep -v '/src/cli/')
[ -n "$lib" ] || { echo "env-doc: no sources under $root/src"; exit 1; }

missing=0
for v in $(names $srcs); do
  if ! grep -qw -- "$v" "$doc"; then
    echo "env-doc: $v is read by $(where "$v" $srcs) but not in $doc"
    missing=1
  fi
done
for v in $(names $lib); do
  if ! grep -qw -- "$v" "$hdr"; then
    echo "env-doc: the library reads $v ($(where "$v" $lib)) but the Caveats of $hdr do not list it"
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
echo "env-doc: $(names $srcs | wc -l) variables, each in $doc and, if the library reads it, in $hdr"
exit 0
