//! Probes the host from a spin-sdk 7 component, by path:
//! `/probe/fetch?url=U` (an outbound GET), `/probe/spin` (a variable and
//! the key-value store), `/probe/loop` (never returns), `/probe/sleep`
//! (sleeps for an hour in a blocking WASI call), `/probe/panic`,
//! `/probe/big` (a 2 MiB body).

use spin_sdk::http::{IntoResponse, Request};
use spin_sdk::http_service;
use spin_sdk::key_value::Store;

#[http_service]
async fn probe(request: Request) -> impl IntoResponse {
    let path = request
        .headers()
        .get("spin-path-info")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    match path.as_str() {
        "/fetch" => {
            let url = query.strip_prefix("url=").unwrap_or_default();
            match spin_sdk::http::get(url).await {
                Ok(response) => reply(200, format!("fetched {}", response.status().as_u16())),
                Err(error) => reply(502, format!("refused: {error}")),
            }
        }
        "/spin" => {
            let greeting = match spin_sdk::variables::get("greeting").await {
                Ok(value) => value,
                Err(error) => format!("no greeting: {error}"),
            };
            let missing = match spin_sdk::variables::get("nope").await {
                Ok(_) => "defined".to_string(),
                Err(error) => format!("{error}"),
            };
            let counted = match Store::open_default().await {
                Ok(store) => {
                    let seen: u64 = match store.get("probe-count").await {
                        Ok(Some(bytes)) => String::from_utf8(bytes)
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0),
                        _ => 0,
                    };
                    let _ = store
                        .set("probe-count", (seen + 1).to_string().as_bytes())
                        .await;
                    let exists = store.exists("probe-count").await.unwrap_or(false);
                    let keys = match store.get_keys().await.collect().await {
                        Ok(keys) => keys.len(),
                        Err(_) => 0,
                    };
                    format!("count {}, exists {exists}, keys {keys}", seen + 1)
                }
                Err(error) => format!("no store: {error}"),
            };
            let other = match Store::open("elsewhere").await {
                Ok(_) => "opened".to_string(),
                Err(error) => format!("{error}"),
            };
            reply(
                200,
                format!("{greeting} | {missing} | {counted} | elsewhere: {other}"),
            )
        }
        "/loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "/sleep" => {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            reply(200, "woke up".into())
        }
        "/panic" => panic!("the probe was asked to panic"),
        "/big" => reply(200, "x".repeat(2 << 20)),
        _ => reply(404, format!("no probe at {path}")),
    }
}

fn reply(status: u16, body: String) -> http::Response<String> {
    http::Response::builder()
        .status(status)
        .body(body)
        .unwrap_or_else(|_| http::Response::new(String::new()))
}
