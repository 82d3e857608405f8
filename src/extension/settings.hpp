// Configuration parameters (GUCs) of the extension, defined in settings.cpp.
#pragma once

namespace idem::pg {

/// idempotency.max_json_depth: deepest nesting accepted by jcs() and fingerprint().
extern int max_json_depth;
/// idempotency.key_ttl, in seconds: how long a key counts after its first use.
extern int key_ttl_seconds;
/// idempotency.wait_timeout, in milliseconds: how long begin() waits for a
/// transaction that holds the same key.
extern int wait_timeout_ms;
/// idempotency.max_key_length, in bytes.
extern int max_key_length;

/// idempotency.lease, in milliseconds: default lease of acquire() and renew().
extern int lease_ms;
/// Range of idempotency.lease and of every per-call lease argument, in
/// milliseconds. Clients renew every third of a lease, at most every 50 ms, so
/// the shortest lease is still renewed twice before it runs out.
constexpr int kMinLeaseMs = 100;
constexpr int kMaxLeaseMs = 86400 * 1000;
/// Longest ttl, for idempotency.key_ttl and every per-call ttl argument.
constexpr int kMaxTtlSeconds = 366 * 86400;

/// Values of idempotency.principal_binding.
enum PrincipalBinding { kBindingOff = 0, kBindingCurrentUser = 1 };
/// idempotency.principal_binding (superuser only): current_user makes every
/// function refuse a principal other than the calling role's name.
extern int principal_binding;
/// idempotency.cleanup_batch_size: rows per batch of idempotency.cleanup().
extern int cleanup_batch_size;

/// idempotency.max_actions (at server start): actions counted each under its
/// own name in idempotency.stats; the others are counted under '(other)'.
extern int max_actions;

/// Values of idempotency.key_format.
enum KeyFormat { kKeyFormatAny = 0, kKeyFormatUuid = 1, kKeyFormatUuidV7 = 2 };
/// idempotency.key_format: which Idempotency-Key values are accepted.
extern int key_format;

/// Values of idempotency.distributed.
enum Distributed { kDistributedAuto = 0, kDistributedOn = 1 };
/// idempotency.distributed: on makes every read and write of the key table a
/// SQL statement (the distributed mode); auto (the default) does so only where
/// Citus distributes idempotency.keys (but for the lookup and a new key's insert
/// on the node that holds the principal's shard, which read and write the
/// shard's table directly under Citus's shard lock), and reads and writes a
/// local table's heap and primary key directly otherwise.
extern int distributed;

/// True when responses with this status are stored (idempotency.final_statuses).
bool is_final_status(int status);

/// Defines every setting and reserves the idempotency. prefix (from _PG_init).
void define_settings();

/// Refuses to run while a setting may be in effect with a value other than
/// the one set for it: a value set before the library was loaded that
/// PostgreSQL dropped when it loaded (invalid, or a superuser-only setting set
/// by a role that may not set it). 42501 for idempotency.principal_binding,
/// 22023 for the others; see settings.cpp for how long the refusal lasts.
/// Every SQL function calls it first; a test of two masks when nothing was dropped.
void require_valid_settings();

}  // namespace idem::pg
