//! A WASIp2 component (spin-sdk 5): `fermyon:spin/variables@2.0.0` and
//! `fermyon:spin/key-value@2.0.0`, served through
//! `wasi:http/incoming-handler@0.2`. With `?sleep=MS` it first sleeps that
//! long, then counts in `p2-after-sleep`: a handler stopped at its deadline
//! never gets there.

use spin_sdk::http::{IntoResponse, Request, Response};
use spin_sdk::http_component;
use spin_sdk::key_value::Store;

#[http_component]
fn handle(request: Request) -> anyhow::Result<impl IntoResponse> {
    let greeting = spin_sdk::variables::get("greeting")?;
    let store = Store::open_default()?;
    if let Some(ms) = request.query().strip_prefix("sleep=") {
        std::thread::sleep(std::time::Duration::from_millis(ms.parse()?));
        let woke: u64 = match store.get("p2-after-sleep")? {
            Some(bytes) => String::from_utf8(bytes)?.parse()?,
            None => 0,
        };
        store.set("p2-after-sleep", (woke + 1).to_string().as_bytes())?;
    }
    let seen: u64 = match store.get("p2-count")? {
        Some(bytes) => String::from_utf8(bytes)?.parse()?,
        None => 0,
    };
    store.set("p2-count", (seen + 1).to_string().as_bytes())?;
    let keys = store.get_keys()?.len();
    Ok(Response::new(
        200,
        format!("p2 says {greeting}; count {}; keys {keys}\n", seen + 1),
    ))
}
