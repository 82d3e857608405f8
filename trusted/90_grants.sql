-- Privileges: as the C++ edition, nothing for PUBLIC on the key store or the
-- protocol; jcs, fingerprint, is_final, bound_principal, http_answer and http_storage keep PUBLIC's
-- EXECUTE (USAGE on the schema is still needed), and so do the helpers they
-- call as their caller, which touch no table. Every other helper of the
-- trusted edition is executable by nobody but the owner.

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::regnamespace
           AND p.proname NOT IN ('jcs', 'fingerprint', 'is_final', 'bound_principal', 'http_answer', 'http_storage',
                                 -- what those four call as their caller (no table):
                                 'jcs_text', 'jcs_value', 'jcs_container', 'jcs_number',
                                 'utf16_units', 'pointer_tokens', 'exclude_pointers',
                                 'setting_int', 'setting_bad', 'protocol_settings')
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC',
                                  CASE WHEN (SELECT p.prokind FROM pg_catalog.pg_proc AS p
                                              WHERE p.oid OPERATOR(pg_catalog.=) f) = 'p'
                                       THEN 'PROCEDURE' ELSE 'FUNCTION' END, f);
    END LOOP;
END
$$;
