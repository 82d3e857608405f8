// idem::Connection: a libpqxx connection through which idem::Client can send
// several statements in one network round trip (libpq pipeline mode).
//
//   idem::Connection connection{"dbname=shop"};
//   idem::Client client{connection};
//   client.handle(request, [&](pqxx::transaction_base& tx) { ... });
//
// With a pqxx::transaction_base& handler on an idem::Connection, the client sends
// BEGIN with idempotency.begin() and idempotency.complete() with COMMIT: a keyed
// request costs the round trips of the handler's own transaction and no more.
// Everywhere else it is an ordinary pqxx::connection.
#pragma once

#include <string>

#include <pqxx/connection>

namespace idem {

namespace detail {

/// Connects like pqxx::connection (connect_direct) and remembers the libpq handle
/// each time libpqxx opens, reopens or closes it.
class RecordingPolicy : public pqxx::connect_direct {
public:
    /// Same connection string syntax as libpq's PQconnectdb().
    explicit RecordingPolicy(const std::string& options) : pqxx::connect_direct(options) {}
    handle do_startconnect(handle orig) override { return handle_ = pqxx::connect_direct::do_startconnect(orig); }
    handle do_completeconnect(handle orig) override {
        return handle_ = pqxx::connect_direct::do_completeconnect(orig);
    }
    handle do_dropconnect(handle orig) noexcept override {
        return handle_ = pqxx::connect_direct::do_dropconnect(orig);
    }
    handle do_disconnect(handle orig) noexcept override {
        return handle_ = pqxx::connect_direct::do_disconnect(orig);
    }
    /// The libpq connection libpqxx currently uses (null when closed).
    handle current() const noexcept { return handle_; }

private:
    handle handle_ = nullptr;
};

}  // namespace detail

/// A pqxx::connection_base that also lets idem::Client use libpq's pipeline mode
/// (PostgreSQL 14+ libpq) on it. Connects at construction like pqxx::connection;
/// throws pqxx::broken_connection when it cannot.
class Connection : public pqxx::connection_base {
public:
    /// `options`: a libpq connection string ("host=... dbname=..." or a URI).
    explicit Connection(const std::string& options) : pqxx::connection_base(policy_), policy_(options) { init(); }
    ~Connection() noexcept { close(); }

    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    /// The underlying libpq connection (PGconn*), null while closed. For the
    /// client library; statements sent on it bypass libpqxx's bookkeeping.
    pqxx::connectionpolicy::handle raw_connection() const noexcept { return policy_.current(); }

private:
    detail::RecordingPolicy policy_;
};

}  // namespace idem
