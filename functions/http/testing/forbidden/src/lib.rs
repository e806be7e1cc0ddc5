//! Imports `spin:sqlite`, which Laurel does not provide: refused at load.

use spin_sdk::http::{IntoResponse, Request};
use spin_sdk::http_service;

#[http_service]
async fn handle(_request: Request) -> impl IntoResponse {
    match spin_sdk::sqlite::Connection::open_default().await {
        Ok(_) => "opened\n",
        Err(_) => "no database\n",
    }
}
