# For the trusted edition's run of sql/guarantees.sql: section 8 binds
# principals per session (SET idempotency.principal_binding, then SET ROLE),
# which the trusted edition cannot enforce: a placeholder any role may SET off.
# It refuses every call instead (0A000), which tests/integration/trusted_edition.sh
# checks on its own. Left out: from the section's title to its last DROP ROLE.
/^-- 8\. principal_binding/,/^DROP ROLE g_bob;$/d
