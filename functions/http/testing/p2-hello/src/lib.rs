//! A WASIp2 component (spin-sdk 5): `fermyon:spin/variables@2.0.0` and
//! `fermyon:spin/key-value@2.0.0`, served through
//! `wasi:http/incoming-handler@0.2`.

use spin_sdk::http::{IntoResponse, Request, Response};
use spin_sdk::http_component;
use spin_sdk::key_value::Store;

#[http_component]
fn handle(_request: Request) -> anyhow::Result<impl IntoResponse> {
    let greeting = spin_sdk::variables::get("greeting")?;
    let store = Store::open_default()?;
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
