\set i random(1, 200000)
\set p :i % 1000
SELECT outcome FROM idempotency.begin('tenant_' || :p::int, md5(:i::text)::uuid::text, 'create_order', '\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea);
