package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"

	idempotency "github.com/pg-idempotency/pg-idempotency/client/go"

	"github.com/jackc/pgx/v5"
)

// decodeObject reads a JSON object with its numbers kept as written.
func decodeObject(body []byte) map[string]any {
	var document map[string]any
	decoder := json.NewDecoder(bytes.NewReader(body))
	decoder.UseNumber()
	if decoder.Decode(&document) != nil || decoder.More() {
		return nil
	}
	return document
}

// parseOrder reads an order's body: its item and quantity, or the answer to a
// body that is not an order.
func parseOrder(body []byte) (string, int64, *result) {
	data := decodeObject(body)
	item, _ := data["item"].(string)
	if data == nil || item == "" {
		invalid := problem(400, "Invalid order",
			`The body must be a JSON object with a non-empty "item" string.`)
		return "", 0, &invalid
	}
	quantity := int64(1)
	if raw, present := data["quantity"]; present {
		number, isNumber := raw.(json.Number)
		value, err := strconv.ParseInt(string(number), 10, 64)
		if !isNumber || err != nil || value < 1 || value > 1000 {
			invalid := problem(422, "Invalid quantity", "quantity must be 1 to 1000.")
			return "", 0, &invalid
		}
		quantity = value
	}
	return item, quantity, nil
}

// createOrder validates the body and inserts the order in tx.
func createOrder(ctx context.Context, tx pgx.Tx, principal string, body []byte,
	delayMs int) (result, string) {
	item, quantity, invalid := parseOrder(body)
	if invalid != nil {
		return *invalid, ""
	}
	if delayMs > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8 / 1000)", delayMs); err != nil {
			return internalError(err), ""
		}
	}
	var id int64
	var createdAt string
	err := tx.QueryRow(ctx, "INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, $3)"+
		" RETURNING id, created_at::text", principal, item, quantity).Scan(&id, &createdAt)
	if err != nil {
		return internalError(err), ""
	}
	document := map[string]any{"id": id, "item": item, "quantity": quantity,
		"created_at": createdAt}
	headers := idempotency.Headers{{Name: "Content-Type", Value: "application/json"},
		{Name: "Location", Value: "/orders/" + strconv.FormatInt(id, 10)}}
	return result{201, headers, dumps(document)}, strconv.FormatInt(id, 10)
}

// createAPIKey inserts a key and answers its secret, which is made here (not in
// RETURNING: Citus refuses volatile functions there).
func createAPIKey(ctx context.Context, tx pgx.Tx, principal string, body []byte) (result, string) {
	data := decodeObject(body)
	name, _ := data["name"].(string)
	if data == nil || name == "" {
		detail := `The body must be a JSON object with a non-empty "name" string.`
		return problem(400, "Invalid API key request", detail), ""
	}
	var id int64
	err := tx.QueryRow(ctx, "INSERT INTO api_keys (principal, name) VALUES ($1, $2) RETURNING id",
		principal, name).Scan(&id)
	if err != nil {
		return internalError(err), ""
	}
	headers := idempotency.Headers{{Name: "Content-Type", Value: "application/json"},
		{Name: "Location", Value: "/api-keys/" + strconv.FormatInt(id, 10)}}
	document := map[string]any{"id": id, "name": name, "secret": randomSecret()}
	return result{201, headers, dumps(document)}, strconv.FormatInt(id, 10)
}
