#!/bin/sh
# Issue 28: the simulator builds the production protocol objects (replication/replica,
# recovery/coordinator, recovery/session) and fakes only network, store, clock and crashes, so it
# names no shell file and no shell function whose policy moved into those objects. A copy of shell
# glue creeping back in fails here.
#
# State transfer is the replica's (replication/replica_join.c): the sim performs its SNAPSHOT,
# JOIN_CLEAR and JOIN_INSTALL items and names no transfer.c glue. Still modelled, and so allowed
# by name: the fence (recovery/fence.c, a pure part the sim links; sim_replica.c runs it as
# server.c does) and src/server/cut.c (tests/sim/cutroute.c models its read views for the
# export's router). tests/sim/regressions.txt is history.
# usage: no_shell_copies.sh DIR
dir=${1:-$(dirname "$0")}
pattern='\b(update|scheduler|server|client|reply|api|registry|transfer)\.c\b|run_joiner|on_snap_req|wake_parked|apply_txn|install_view|hold_future|push_sync|do_reply|bad_keys|handle_hello|start_drain|maybe_end_job|align_start|handle_msg'
if grep -nE "$pattern" "$dir"/*.c "$dir"/*.h; then
    echo "no_shell_copies: tests/sim names shell code (above): build the production object instead"
    exit 1
fi
echo "no_shell_copies: tests/sim names no shell file or function"
