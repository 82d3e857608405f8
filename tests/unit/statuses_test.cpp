// The status lists of idempotency.final_statuses, shared by the extension and the client.
#include <gtest/gtest.h>

#include "statuses.hpp"

namespace {

using idem::core::parse_status_list;
using idem::core::StatusTable;

bool final_in(const char* list, int status) {
    StatusTable table;
    EXPECT_TRUE(parse_status_list(list, table)) << list;
    return table[static_cast<std::size_t>(status - 100)];
}

TEST(StatusList, CodesAndClasses) {
    const char* defaults = "2xx,400,403,404,409,410,412,413,415,422";
    EXPECT_TRUE(final_in(defaults, 200));
    EXPECT_TRUE(final_in(defaults, 299));
    EXPECT_TRUE(final_in(defaults, 409));
    EXPECT_FALSE(final_in(defaults, 401));
    EXPECT_FALSE(final_in(defaults, 429));
    EXPECT_FALSE(final_in(defaults, 500));
    EXPECT_FALSE(final_in(defaults, 302));
    EXPECT_TRUE(final_in(" 5XX , 418", 503));
    EXPECT_TRUE(final_in(" 5XX , 418", 418));
    EXPECT_FALSE(final_in("", 200));
}

TEST(StatusList, RejectsOtherEntries) {
    StatusTable table;
    for (const char* bad : {"600", "6xx", "2x", "abc", "2xx,4x5", "0xx", "1000", "20"})
        EXPECT_FALSE(parse_status_list(bad, table)) << bad;
}

}  // namespace
