// The Fastify plugin, as require("pg-idempotency/fastify"): kept out of the main
// entry point so that Express users need neither fastify nor its types.
"use strict";
module.exports = require("./dist/fastify.js");
