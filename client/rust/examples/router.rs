use std::collections::HashMap;
use std::time::Duration;

use pg_idempotency::{BoxError, Client, Request, Response, Router, RouterOptions};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The default target (the coordinator, or any node), then each node as Citus names it
    // in pg_dist_node ("nodename:nodeport") with the config that connects to it.
    let coordinator: tokio_postgres::Config = "host=10.0.0.1 user=app dbname=shop".parse()?;
    let mut nodes = HashMap::new();
    nodes.insert("10.0.0.5:5432".to_string(), "host=10.0.0.5 user=app dbname=shop".parse()?);
    nodes.insert("10.0.0.6:5432".to_string(), "host=10.0.0.6 user=app dbname=shop".parse()?);
    let options = RouterOptions {
        refresh: Duration::from_secs(60), // the defaults, from client/protocol.json
        node_down: Duration::from_secs(5),
        max_principals: 10_000,
        ..RouterOptions::default()
    };
    let router = Router::new(coordinator, nodes, options)?; // Sync: one per process
    let client = Client::default();

    let request = Request::new("user-42", Some("order-1".into()), "POST", "/orders", None);
    let mut rerun = true;
    let response = loop {
        // A connection to the principal's node (an idle one, or a new one); the default
        // target when it has no placement, its node is down, or the lookup failed.
        let mut routed = router.connect(&request.principal).await?;
        let mut ran = false; // set by the handler: after it ran, a stale error is not rerun
        let result = client
            .handle(&mut routed.conn, &request, |tx| {
                ran = true;
                Box::pin(async move {
                    tx.execute("INSERT INTO orders (item) VALUES ('book')", &[]).await?;
                    Ok(Response::new(201, vec![], "{}"))
                })
            })
            .await;
        println!("{:?} {:?}", routed.node, router.counters());
        router.release(routed); // kept idle for the next request to that node
        match result {
            // The shard moved and the old node refused a call: the placement is dropped
            // (looked up again); a refused begin (the handler has not run) runs once more.
            Err(error) if error.is_stale_placement() => {
                router.report_stale_placement(&request.principal);
                if ran || !std::mem::take(&mut rerun) {
                    break Err(error);
                }
            }
            other => break other,
        }
    }?;
    println!("{}", response.status);
    Ok(())
}
