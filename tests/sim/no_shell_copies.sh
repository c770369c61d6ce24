#!/bin/sh
# Issue 28: the simulator builds the production protocol objects (replication/replica,
# recovery/coordinator, recovery/session) and fakes only network, store, clock and crashes, so it
# names no shell file and no shell function whose policy moved into those objects. A copy of shell
# glue creeping back in fails here.
#
# State transfer is the replica's (replication/replica_join.c): the sim performs its SNAPSHOT,
# JOIN_CLEAR and JOIN_INSTALL items and names no transfer.c glue. So is the fence
# (replication/replica_fence.c runs recovery/fence.c): the sim asks the replica
# (cps__replica_admit, _turned, _view_news, _view) and may only read its standing
# (cps__fence_unsure and the like on cps__replica_fence); the calls that decide it and the shell's
# glue around them (check_stall) are refused. Still modelled, and so allowed by
# name: src/server/cut.c (tests/sim/cutroute_servers.c models its read views for the export's router). tests/sim/regressions.txt is history. The tensor registry is no shell's any
# more (recovery/registry.c, held by the coordinator), so the sim may name it. The names below
# also cover the tool answers and worker calls that moved into the coordinator and the session
# (STATUS, REGISTRY, REGISTER, the join's check, the wait for an op, the leave).
# usage: no_shell_copies.sh DIR
dir=${1:-$(dirname "$0")}
pattern='\b(update|scheduler|server|client|reply|api|layout|localset|freq|transfer|worker|spec)\.c\b|run_joiner|on_snap_req|wake_parked|apply_txn|install_view|hold_future|push_sync|do_reply|bad_keys|handle_hello|start_drain|maybe_end_job|align_start|handle_msg|handle_status|handle_registry|on_register|view_reply|ask_scheduler|sched_call|op_wait|on_detect|keep_serving_to_drain|check_job|check_stall|cps__fence_(create|destroy|admit|check|turned|view|install|rejoin)\b'
if grep -nE "$pattern" "$dir"/*.c "$dir"/*.h; then
    echo "no_shell_copies: tests/sim names shell code (above): build the production object instead"
    exit 1
fi
echo "no_shell_copies: tests/sim names no shell file or function"
