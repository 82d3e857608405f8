// idem::Connection: a libpqxx connection through which idem::Client can send
// several statements in one network round trip (libpq pipeline mode).
//
//   idem::Connection connection{"dbname=shop"};
//   idem::Client client{connection};
//   client.handle(request, [&](pqxx::transaction_base& tx) { ... });
//   pqxx::work other{connection};   // usable as any libpqxx connection
//
// With a pqxx::transaction_base& handler on an idem::Connection, the client sends
// BEGIN with idempotency.begin() and idempotency.complete() with COMMIT: a keyed
// request costs the round trips of the handler's own transaction and no more.
// Everywhere else it stands for the libpqxx connection it holds (the same with
// libpqxx 6, 7 and 8; how that connection is made differs, in client/cpp/src).
#pragma once

#include <memory>
#include <string>

#include <libpq-fe.h>
#include <pqxx/connection>
#include <pqxx/version>

namespace idem {

/// The libpqxx connection class the library works with: pqxx::connection_base
/// with libpqxx 6, pqxx::connection with libpqxx 7 and 8.
#if PQXX_VERSION_MAJOR < 7
using PqxxConnection = pqxx::connection_base;
#else
using PqxxConnection = pqxx::connection;
#endif

/// A libpqxx connection that also lets idem::Client use libpq's pipeline mode
/// (PostgreSQL 14+ libpq) on it. Connects at construction like pqxx::connection;
/// throws pqxx::broken_connection when it cannot. Converts to PqxxConnection&,
/// so transactions open on it directly (pqxx::work tx{connection}).
class Connection {
public:
    /// `options`: a libpq connection string ("host=... dbname=..." or a URI).
    explicit Connection(const std::string& options);
    ~Connection() noexcept;

    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    /// The libpqxx connection, for anything libpqxx offers.
    PqxxConnection& connection() noexcept;
    /// The same, so a Connection goes wherever a libpqxx connection does.
    operator PqxxConnection&() noexcept { return connection(); }

    /// The underlying libpq connection, null while closed. For the client
    /// library; statements sent on it bypass libpqxx's bookkeeping.
    PGconn* raw_connection() const noexcept;

private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace idem
