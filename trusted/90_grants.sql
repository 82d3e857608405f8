-- Privileges: as the C++ edition, nothing for PUBLIC on the key store or the
-- protocol; jcs, fingerprint, is_final and bound_principal keep PUBLIC's
-- EXECUTE (USAGE on the schema is still needed). The helpers of the trusted
-- edition are executable by nobody but the owner.

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::regnamespace
           AND p.proname NOT IN ('jcs', 'fingerprint', 'is_final', 'bound_principal',
                                 'setting_int', 'setting_bad')
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC',
                                  CASE WHEN (SELECT p.prokind FROM pg_catalog.pg_proc AS p
                                              WHERE p.oid OPERATOR(pg_catalog.=) f) = 'p'
                                       THEN 'PROCEDURE' ELSE 'FUNCTION' END, f);
    END LOOP;
END
$$;
