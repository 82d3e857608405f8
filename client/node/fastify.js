// The Fastify plugin, as require("pg-idempotency/fastify") for tools that do not read
// package.json "exports" (TypeScript's node10 resolution): kept out of the main
// entry point so that Express users need neither fastify nor its types.
"use strict";
module.exports = require("./dist/fastify.js");
