// Types of require("pg-idempotency/fastify") (fastify.js).
export * from "./dist/fastify";
