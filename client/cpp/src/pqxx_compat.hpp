// Every difference between the libpqxx versions the client builds against
// (6.4 in bookworm, 7.10 in trixie, 8.0 in forky), in one place: parameterized
// and prepared statements, bytea in both directions, and the hooks of a
// transaction class. libpqxx 6 spells statements exec_params(sql, args...),
// 7 deprecates that for exec(sql, pqxx::params{args...}), 8 removes the old
// spelling, wants the transaction as the params' first argument (client
// encoding) and needs C++20. Private to the library and its tests and examples.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <pqxx/pqxx>

#if PQXX_VERSION_MAJOR < 6 || PQXX_VERSION_MAJOR > 8
#error "the idempotency client builds against libpqxx 6, 7 and 8"
#endif

namespace idem::pq {

/// Makes `sql` the session's prepared statement `name`. libpqxx 6 only records
/// it (and prepares it on first use, again after a reconnect); 7 and 8 prepare
/// at once, where a statement of that name the session has already (another
/// Client on the same connection) counts as prepared. Call it outside a
/// transaction: a refused PREPARE would abort one.
template <class Connection>
void prepare(Connection& connection, const char* name, const char* sql) {
#if PQXX_VERSION_MAJOR < 7
    connection.prepare(name, sql);
#else
    try {
        connection.prepare(name, sql);
    } catch (const pqxx::sql_error& e) {
        if (e.sqlstate() != "42P05") throw;  // duplicate_prepared_statement
    }
#endif
}

/// A bytea parameter of a statement: the bytes of `value`, which must outlive
/// the statement's execution (libpqxx 6 copies them into a binarystring).
#if PQXX_VERSION_MAJOR < 7
inline pqxx::binarystring bytes(std::string_view value) {
    return pqxx::binarystring(value.data(), value.size());
}
#else
inline pqxx::bytes_view bytes(std::string_view value) {
    return pqxx::bytes_view(reinterpret_cast<const std::byte*>(value.data()), value.size());
}
#endif

/// The bytes of a bytea field (not NULL): a pqxx::field, or in libpqxx 8 the
/// pqxx::field_ref that indexing a row gives.
template <class Field>
std::string bytes_of(const Field& field) {
#if PQXX_VERSION_MAJOR < 7
    return pqxx::binarystring(field).str();
#else
    const auto value = field.template as<pqxx::bytes>();
    return std::string(reinterpret_cast<const char*>(value.data()), value.size());
#endif
}

/// A text parameter: the string's characters, or SQL NULL when it is empty.
inline const char* c_str_or_null(const std::optional<std::string>& value) {
    return value ? value->c_str() : nullptr;
}

/// An exception of libpqxx's class E for a failed statement (libpqxx 6 keeps
/// only the message; 7 and 8 also the statement and the SQLSTATE).
template <class E>
E error(const std::string& message, const std::string& query, const char* sqlstate) {
#if PQXX_VERSION_MAJOR < 7
    (void)query;
    (void)sqlstate;
    return E(message);
#else
    return E(message, query, sqlstate);
#endif
}

/// Runs the parameterized statement `sql` ($1, $2... bound to `args`; a null
/// `const char*` is SQL NULL) and returns its result.
template <class... Args>
pqxx::result exec(pqxx::transaction_base& tx, const char* sql, Args&&... args) {
#if PQXX_VERSION_MAJOR < 7
    return tx.exec_params(sql, std::forward<Args>(args)...);
#elif PQXX_VERSION_MAJOR < 8
    return tx.exec(sql, pqxx::params{std::forward<Args>(args)...});
#else
    return tx.exec(sql, pqxx::params{tx, std::forward<Args>(args)...});
#endif
}

/// The same for a statement that returns exactly one row (else pqxx::unexpected_rows).
template <class... Args>
pqxx::row exec1(pqxx::transaction_base& tx, const char* sql, Args&&... args) {
#if PQXX_VERSION_MAJOR < 7
    return tx.exec_params1(sql, std::forward<Args>(args)...);
#else
    return exec(tx, sql, std::forward<Args>(args)...).one_row();
#endif
}

/// Runs the statement prepared under `name` (connection::prepare) with `args`, or `sql`
/// as exec() does when `name` is null.
template <class... Args>
pqxx::result exec_as(pqxx::transaction_base& tx, const char* name, const char* sql,
                     const Args&... args) {
    if (name == nullptr) return exec(tx, sql, args...);
#if PQXX_VERSION_MAJOR < 7
    return tx.exec_prepared(name, args...);
#elif PQXX_VERSION_MAJOR < 8
    return tx.exec(pqxx::prepped{name}, pqxx::params{args...});
#else
    return tx.exec(pqxx::prepped{name}, pqxx::params{tx, args...});
#endif
}

}  // namespace idem::pq
