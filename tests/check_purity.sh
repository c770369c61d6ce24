#!/bin/sh
# replication/ and recovery/ are pure protocol logic: no sockets, no LMDB, no clock, no sleep.
# Fails listing every offending line.
root=${1:-.}
bad=$(grep -nE '#include *<(nanomsg/|lmdb\.h|unistd\.h|time\.h|sys/socket\.h|poll\.h)|\b(nn_[a-z_]+|mdb_[a-z_]+|clock_gettime|usleep|nanosleep|sleep|gettimeofday|time)\(' \
      "$root"/replication/*.[ch] "$root"/recovery/*.[ch] 2>/dev/null)
if [ -n "$bad" ]; then
  echo "purity: protocol code must not do I/O or read the clock:"
  echo "$bad"
  exit 1
fi
echo "purity: replication/ and recovery/ are free of I/O and clocks"
exit 0
