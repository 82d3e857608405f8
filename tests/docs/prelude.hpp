// Prelude of every C++ block of the docs (tests/docs/check.py): the names a block
// uses without defining them. Blocks are compiled (-fsyntax-only) against the
// installed client library, not run, so declarations are enough.
#pragma once
#include <idem/client.hpp>
#include <idem/lease.hpp>

#include <optional>
#include <string>

extern std::string authenticated_user_id;
std::optional<std::string> header_or_nullopt(const char* name);
extern std::string raw_body;
extern std::string item;
extern idem::Request request;
idem::Response call_payment_provider(const idem::Request& request);
void send(const idem::Response& response);
