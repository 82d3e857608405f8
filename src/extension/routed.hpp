// A session routed to the node of its principals' shards (routed.cpp):
// idempotency.routed and the planner hook that lets such a session keep one
// plan of a prepared protocol call under Citus.
#pragma once

namespace idem::pg {

/// idempotency.routed: on in a session that a router sent to the node that
/// holds the shard of the principals it serves (a Citus worker). There a
/// prepared call of a protocol function keeps one generic plan, which Citus
/// would otherwise refuse it (Citus plans such a call again at every execution
/// to delegate it by its argument); a call whose shard is elsewhere is then
/// refused as a stale placement instead of delegated. Off by default.
extern bool routed;

/// Defines idempotency.routed and installs the planner hook (from _PG_init).
void routed_init();

}  // namespace idem::pg
