// The two values every room of the protocol passes around: a key row as it is
// in idempotency.keys, and the response a call stores.
#pragma once

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
}

namespace idem::pg {

/// One row of idempotency.keys (read by the table's own attribute numbers in
/// key_store.cpp), or the row a new attempt is about to write. Pointers point
/// into memory of the current memory context, never into a shared buffer.
struct KeyRow {
    bool found = false;      // false: no row (every other field is unset)
    bool completed = false;  // state: completed, or in_progress
    bool tombstone = false;  // state: expired (lease_until: when the key expired)
    bytea* request_sha256 = nullptr;
    Datum action = 0;  // text (rows read from the table only)
    bool has_status = false;
    int status = 0;
    Datum headers = 0;      // jsonb
    Datum body = 0;         // bytea
    Datum resource_id = 0;  // text
    bool headers_null = true;
    bool body_null = true;
    bool resource_id_null = true;
    bool one_time_secret = false;
    int64 fence = 0;
    bool has_lease = false;
    TimestampTz lease_until = 0;
    TimestampTz created_at = 0;
    TimestampTz expires_at = 0;
    bool has_times = false;  // created_at and expires_at are set

    /// A lease holds the row: lease_until is later than clock_timestamp()
    /// (only in_progress rows have a lease).
    bool leased() const;
    /// The row counts: its key has not expired (now()) or a lease holds it.
    /// A row that is not live behaves as absent. A tombstone is live until it
    /// goes (its expires_at), and no lease holds it.
    bool live() const;
    /// When the key expired: a tombstone keeps that time in lease_until.
    TimestampTz expired_at() const { return tombstone ? lease_until : expires_at; }
};

/// The response a call stores, built once from its arguments. A one-time
/// secret keeps neither body nor headers: only the status and the marker.
struct StoredResponse {
    int status;
    Datum headers;
    Datum body;
    Datum resource_id;
    bool headers_null;
    bool body_null;
    bool resource_id_null;
    bool one_time_secret;
};

/// The request a call names: principal, key, action and fingerprint, checked.
struct Request {
    text* principal;
    text* key;
    text* action;
    bytea* fingerprint;
};

}  // namespace idem::pg
