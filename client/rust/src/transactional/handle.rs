//! `Client::handle`: one request through the transactional protocol on a `Connection`,
//! the handler's writes and the key row in one transaction.

use tokio::sync::mpsc;
use tokio_postgres::Transaction;

use super::{Begun, Client, Connection, HandlerFuture};
use crate::common::Request;
use crate::db::{Db, Param};
use crate::error::{BoxError, Error};
use crate::http::Response;
use crate::statements::{BEGIN_SQL, COMPLETE_SQL, SAVE_FINAL_SQL, STORED_EXPIRY_SQL};
use crate::stream::{StreamEvent, StreamWriter};

/// Told the key row's expiry when begin started the key (the stream's head carries it).
type OnBegin<'a> = &'a (dyn Fn(Option<i64>) + Sync);

impl Client {
    /// Runs `handler` through the protocol on `conn` and returns the response to send.
    ///
    /// The handler does its writes in the transaction it is given and does not commit.
    /// A final success is completed in that transaction; a final error is rolled back
    /// and stored by `save_final`; anything else (401, 429, 3xx, 5xx) is rolled back and
    /// not stored, so a retry runs again. A handler error rolls back, stores nothing and
    /// comes back as `Error::Body`. Serialization failures (40001) and deadlocks
    /// (40P01) rerun the whole attempt, handler included, up to `max_attempts`.
    ///
    /// A request without a key on a method outside `methods_requiring_key` runs the
    /// handler in a plain transaction.
    pub async fn handle<F>(
        &self,
        conn: &mut Connection,
        request: &Request,
        handler: F,
    ) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t Transaction<'t>) -> HandlerFuture<'t>,
    {
        self.handle_with(conn, request, handler, &|_: Option<i64>| {}).await
    }

    /// `handle` for a handler that may stream (module `stream`): the handler gets a
    /// `StreamWriter` whose chunks go to `out` as they are written, in the transaction
    /// that holds the key. Every answer goes to `out` too: a `Whole` response (replays,
    /// problems, a handler that did not stream), or the `Head`, the `Chunk`s and, once the
    /// key is settled, `End`. When `out` closes without `End` after a `Head`, the stream
    /// broke and nothing was stored. A stream is never rerun: a serialization failure after
    /// its first chunk ends it with an error. Returns what `handle` returns (for a stream:
    /// the response as stored).
    pub async fn handle_stream<F>(
        &self,
        conn: &mut Connection,
        request: &Request,
        out: mpsc::Sender<StreamEvent>,
        mut handler: F,
    ) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t Transaction<'t>, StreamWriter) -> HandlerFuture<'t>,
    {
        let writer = StreamWriter::new(out.clone(), self.options.max_stream_bytes);
        let on_begin = |expires: Option<i64>| writer.set_expires(expires);
        // The handler's answer becomes the stream as stored once it has started.
        let result = self
            .handle_with(
                conn,
                request,
                |tx| {
                    let (writer, rerun) = (writer.clone(), writer.started());
                    let answer = handler(tx, writer.clone());
                    Box::pin(async move {
                        if rerun {
                            return Err("a stream sent in part is never run again".into());
                        }
                        let answer = answer.await?;
                        if !writer.started() {
                            return Ok(answer);
                        }
                        writer.stored(&answer).map_err(|e| Box::new(e) as BoxError)
                    })
                },
                &on_begin,
            )
            .await;
        match &result {
            Ok(_) if writer.started() => writer.end().await,
            Ok(response) => {
                let _ = out.send(StreamEvent::Whole(response.clone())).await;
            }
            Err(_) => {} // out closes: a 500, or a broken stream
        }
        result
    }

    async fn handle_with<F>(
        &self,
        conn: &mut Connection,
        request: &Request,
        mut handler: F,
        on_begin: OnBegin<'_>,
    ) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t Transaction<'t>) -> HandlerFuture<'t>,
    {
        let method = request.method.to_ascii_uppercase();
        let needs_key =
            self.options.methods_requiring_key.iter().any(|m| m.eq_ignore_ascii_case(&method));
        if request.key.is_none() && !needs_key {
            let tx = conn.client.transaction().await?;
            let response = handler(&tx).await.map_err(Error::Body)?;
            tx.commit().await?;
            return Ok(response);
        }
        if let Some(answer) = self.check_key(request) {
            return Ok(answer);
        }
        // Known before any transaction.
        self.final_statuses.load(Db::Pg(&conn.client, &[])).await?;
        if conn.prepared.is_empty() {
            for sql in [BEGIN_SQL, COMPLETE_SQL, SAVE_FINAL_SQL, STORED_EXPIRY_SQL] {
                let statement = conn.client.prepare(sql).await?;
                conn.prepared.push((sql, statement));
            }
        }
        let mut attempt = 1;
        loop {
            match self.attempt(conn, request, &mut handler, on_begin).await {
                Err(error) if error.is_retryable() && attempt < self.options.max_attempts => {
                    attempt += 1
                }
                other => return other,
            }
        }
    }

    /// One attempt: BEGIN; begin(); the handler; complete() and COMMIT sent together.
    async fn attempt<F>(
        &self,
        conn: &mut Connection,
        request: &Request,
        handler: &mut F,
        on_begin: OnBegin<'_>,
    ) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t Transaction<'t>) -> HandlerFuture<'t>,
    {
        let Connection { client, prepared } = conn;
        let prepared: &[_] = prepared;
        let tx = client.transaction().await?;
        let expires = match self.begin_on(Db::Pg(tx.client(), prepared), request).await? {
            (Begun::Started, expires) => {
                on_begin(expires);
                expires
            }
            (Begun::Answer(_, response), _) => {
                tx.commit().await?; // nothing held; ends the transaction
                return Ok(response);
            }
            (Begun::Rejected(response), _) => {
                tx.rollback().await?;
                return Ok(response);
            }
        };
        let mut answer = match handler(&tx).await {
            Ok(answer) => answer,
            Err(error) => {
                tx.rollback().await?; // nothing is stored; the error propagates
                return Err(Error::Body(error));
            }
        };
        if !(100..=599).contains(&answer.status) {
            tx.rollback().await?;
            return Err(Error::Protocol(format!("handler returned HTTP status {}", answer.status)));
        }
        if !self.final_statuses.is_final(answer.status) {
            // 401, 429, 3xx, 5xx: no effect may stay and nothing is stored, so a retry
            // after a token refresh, throttling or a crash takes effect once.
            tx.rollback().await?;
            return Ok(answer);
        }
        if answer.status >= 400 {
            // A final error has no effect to keep: roll back, then store it alone.
            tx.rollback().await?;
            // Sent together, in this order: join! polls its futures in order the first
            // time, and a prepared statement goes out on its future's first poll.
            let key =
                [Param::Text(Some(&request.principal)), Param::Text(Some(request.key_text()))];
            let (saved, stored) = tokio::join!(
                self.save_final_on(Db::Pg(client, prepared), request, &answer),
                Db::Pg(client, prepared).query(STORED_EXPIRY_SQL, &key)
            );
            saved?;
            // The stored row's expiry: save_final's own now() + ttl.
            answer.set_expires(stored?.first().and_then(|row| row.int(0)));
            return Ok(answer);
        }
        // complete() and COMMIT are sent together (tokio-postgres pipelines requests
        // polled at once): one round trip. A failed complete() aborts the transaction,
        // and COMMIT then ends it with a rollback, so the server-side transaction is over
        // either way.
        let (completed, committed) = tokio::join!(
            self.complete_on(Db::Pg(tx.client(), prepared), request, &answer),
            tx.batch_execute("COMMIT")
        );
        // The Transaction would send ROLLBACK on drop, after the COMMIT: forget it
        // instead. It owns no heap memory (a borrow, no savepoint name, a flag).
        std::mem::forget(tx);
        completed?;
        committed?;
        answer.set_expires(expires); // the row begin made, now committed
        Ok(answer)
    }
}
