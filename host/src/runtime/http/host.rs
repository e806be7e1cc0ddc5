//! What HTTP functions import besides WASI and wasi:http: Spin's variables
//! and key-value (3.0.0, async, for spin-sdk 7; 2.0.0 for older spin-sdk),
//! and Laurel's `laurel:http` events and progress.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use wasmtime::component::{Accessor, FutureReader, HasData, Linker, Resource, StreamReader};

use super::HttpState;

mod generated {
    wasmtime::component::bindgen!({
        path: "../wit/http",
        world: "laurel:http/host",
        imports: {
            "laurel:http/events": async | trappable,
            "laurel:http/progress": async | trappable,
            "fermyon:spin/key-value": async | trappable,
            default: trappable,
        },
        with: {
            "spin:key-value/key-value.store": super::KvStore,
            "fermyon:spin/key-value.store": super::KvStore,
        },
    });
}

use generated::fermyon::spin::{key_value as kv2, variables as vars2};
use generated::laurel::http::{events, progress};
use generated::spin::key_value::key_value as kv3;
use generated::spin::variables::variables as vars3;

/// An open key-value store: `<application>/<label>`, the label checked
/// against the component's `key_value_stores` when opened.
pub struct KvStore {
    label: String,
}

/// Why a key-value operation failed.
#[derive(Debug, Clone)]
pub enum KvError {
    NoSuchStore,
    AccessDenied,
    Other(String),
}

/// Laurel's services, as HTTP functions see them.
pub trait HttpServices: Send + Sync + 'static {
    /// Publishes JSON event envelopes to `events.<source>`, all or none.
    fn publish(
        &self,
        source: String,
        events: Vec<String>,
    ) -> BoxFuture<'static, Result<u32, String>>;
    /// A user's awards as the public API's JSON.
    fn user_awards(&self, user_id: String) -> BoxFuture<'static, Result<String, ProgressError>>;
    /// One award's progress for a public badge, as JSON (see the WIT).
    fn public_badge(
        &self,
        user_id: String,
        award_id: String,
    ) -> BoxFuture<'static, Result<String, ProgressError>>;
    /// Key-value stores (Spin's `key_value_stores`): one namespace per label.
    fn kv_get(
        &self,
        label: String,
        key: String,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, KvError>>;
    fn kv_set(
        &self,
        label: String,
        key: String,
        value: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), KvError>>;
    fn kv_delete(&self, label: String, key: String) -> BoxFuture<'static, Result<(), KvError>>;
    fn kv_exists(&self, label: String, key: String) -> BoxFuture<'static, Result<bool, KvError>>;
    fn kv_keys(&self, label: String) -> BoxFuture<'static, Result<Vec<String>, KvError>>;
    /// Whether outbound requests go through a proxy pool (then through
    /// [`HttpServices::send_outbound`]; otherwise straight out).
    fn proxies_outbound(&self) -> bool;
    /// Sends an (allowed) outbound request through a proxy allocated for
    /// it from the pool; the error says why it was not sent or failed.
    fn send_outbound(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> BoxFuture<'static, Result<http::Response<bytes::Bytes>, String>>;
}

#[derive(Debug, Clone)]
pub enum ProgressError {
    NotFound(String),
    Unavailable(String),
}

/// The part of a request's store the imports use.
pub struct SpinCtx {
    /// The application's name: its key-value stores are its own.
    pub app: Arc<str>,
    pub variables: Arc<HashMap<String, String>>,
    pub stores: Arc<Vec<String>>,
    pub services: Arc<dyn HttpServices>,
}

pub(super) fn add_to_linker(linker: &mut Linker<HttpState>) -> wasmtime::Result<()> {
    events::add_to_linker::<_, Spin>(linker, HttpState::spin_view)?;
    progress::add_to_linker::<_, Spin>(linker, HttpState::spin_view)?;
    vars3::add_to_linker::<_, Spin>(linker, HttpState::spin_view)?;
    kv3::add_to_linker::<_, Spin>(linker, HttpState::spin_view)?;
    vars2::add_to_linker::<_, Spin>(linker, HttpState::spin_view)?;
    kv2::add_to_linker::<_, Spin>(linker, HttpState::spin_view)?;
    Ok(())
}

/// The `HasData` marker of these imports.
pub struct Spin;

impl HasData for Spin {
    type Data<'a> = SpinView<'a>;
}

pub struct SpinView<'a> {
    ctx: &'a SpinCtx,
    // (the store's resource table: key-value stores live there)
    table: &'a mut wasmtime::component::ResourceTable,
}

impl<'a> SpinView<'a> {
    pub(super) fn new(ctx: &'a SpinCtx, table: &'a mut wasmtime::component::ResourceTable) -> Self {
        SpinView { ctx, table }
    }
}

// --- laurel:http -----------------------------------------------------------

impl events::Host for SpinView<'_> {
    async fn publish(
        &mut self,
        source: String,
        events: Vec<String>,
    ) -> wasmtime::Result<Result<u32, String>> {
        Ok(self.ctx.services.publish(source, events).await)
    }
}

impl progress::Host for SpinView<'_> {
    async fn user_awards(
        &mut self,
        user_id: String,
    ) -> wasmtime::Result<Result<String, progress::ProgressError>> {
        Ok(self
            .ctx
            .services
            .user_awards(user_id)
            .await
            .map_err(progress_error))
    }

    async fn public_badge(
        &mut self,
        user_id: String,
        award_id: String,
    ) -> wasmtime::Result<Result<String, progress::ProgressError>> {
        Ok(self
            .ctx
            .services
            .public_badge(user_id, award_id)
            .await
            .map_err(progress_error))
    }
}

fn progress_error(error: ProgressError) -> progress::ProgressError {
    match error {
        ProgressError::NotFound(m) => progress::ProgressError::NotFound(m),
        ProgressError::Unavailable(m) => progress::ProgressError::Unavailable(m),
    }
}

// --- variables -------------------------------------------------------------

impl SpinView<'_> {
    fn variable(&self, name: &str) -> Result<String, (bool, String)> {
        let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err((false, format!("`{name}` is not a variable name")));
        }
        self.ctx.variables.get(name).cloned().ok_or_else(|| {
            (
                true,
                format!("the component has no variable `{name}` in spin.toml"),
            )
        })
    }
}

impl vars3::Host for SpinView<'_> {}

impl<U> vars3::HostWithStore<U> for Spin {
    async fn get(
        store: &Accessor<U, Self>,
        name: String,
    ) -> wasmtime::Result<Result<String, vars3::Error>> {
        Ok(store.with(|mut view| {
            view.get().variable(&name).map_err(|(known, m)| {
                if known {
                    vars3::Error::Undefined(m)
                } else {
                    vars3::Error::InvalidName(m)
                }
            })
        }))
    }
}

impl vars2::Host for SpinView<'_> {
    fn get(&mut self, name: String) -> wasmtime::Result<Result<String, vars2::Error>> {
        Ok(self.variable(&name).map_err(|(known, m)| {
            if known {
                vars2::Error::Undefined(m)
            } else {
                vars2::Error::InvalidName(m)
            }
        }))
    }
}

// --- key-value ----------------------------------------------------------

impl SpinView<'_> {
    fn open(&mut self, label: String) -> wasmtime::Result<Result<Resource<KvStore>, KvError>> {
        if !self.ctx.stores.contains(&label) {
            return Ok(Err(KvError::AccessDenied));
        }
        let label = format!("{}/{label}", self.ctx.app);
        Ok(Ok(self.table.push(KvStore { label })?))
    }

    fn label(&self, store: &Resource<KvStore>) -> wasmtime::Result<String> {
        Ok(self.table.get(store)?.label.clone())
    }
}

fn kv3_error(error: KvError) -> kv3::Error {
    match error {
        KvError::NoSuchStore => kv3::Error::NoSuchStore,
        KvError::AccessDenied => kv3::Error::AccessDenied,
        KvError::Other(m) => kv3::Error::Other(m),
    }
}

fn kv2_error(error: KvError) -> kv2::Error {
    match error {
        KvError::NoSuchStore => kv2::Error::NoSuchStore,
        KvError::AccessDenied => kv2::Error::AccessDenied,
        KvError::Other(m) => kv2::Error::Other(m),
    }
}

impl kv3::Host for SpinView<'_> {}

impl kv3::HostStore for SpinView<'_> {
    fn drop(&mut self, store: Resource<KvStore>) -> wasmtime::Result<()> {
        self.table.delete(store)?;
        Ok(())
    }
}

/// Runs a key-value call with the store's label and Laurel's services.
fn with_store<U>(
    store: &Accessor<U, Spin>,
    kv: &Resource<KvStore>,
) -> wasmtime::Result<(String, Arc<dyn HttpServices>)> {
    store.with(|mut view| {
        let view = view.get();
        Ok((view.label(kv)?, view.ctx.services.clone()))
    })
}

impl<U> kv3::HostStoreWithStore<U> for Spin {
    async fn open(
        store: &Accessor<U, Self>,
        label: String,
    ) -> wasmtime::Result<Result<Resource<KvStore>, kv3::Error>> {
        Ok(store
            .with(|mut view| view.get().open(label))?
            .map_err(kv3_error))
    }

    async fn get(
        store: &Accessor<U, Self>,
        kv: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, kv3::Error>> {
        let (label, services) = with_store(store, &kv)?;
        Ok(services.kv_get(label, key).await.map_err(kv3_error))
    }

    async fn set(
        store: &Accessor<U, Self>,
        kv: Resource<KvStore>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), kv3::Error>> {
        let (label, services) = with_store(store, &kv)?;
        Ok(services.kv_set(label, key, value).await.map_err(kv3_error))
    }

    async fn delete(
        store: &Accessor<U, Self>,
        kv: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<(), kv3::Error>> {
        let (label, services) = with_store(store, &kv)?;
        Ok(services.kv_delete(label, key).await.map_err(kv3_error))
    }

    async fn exists(
        store: &Accessor<U, Self>,
        kv: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<bool, kv3::Error>> {
        let (label, services) = with_store(store, &kv)?;
        Ok(services.kv_exists(label, key).await.map_err(kv3_error))
    }

    async fn get_keys(
        store: &Accessor<U, Self>,
        kv: Resource<KvStore>,
    ) -> wasmtime::Result<(StreamReader<String>, FutureReader<Result<(), kv3::Error>>)> {
        let (label, services) = with_store(store, &kv)?;
        let (keys, result) = match services.kv_keys(label).await {
            Ok(keys) => (keys, Ok(())),
            Err(error) => (Vec::new(), Err(kv3_error(error))),
        };
        store.with(|mut access| {
            let stream = StreamReader::new(&mut access, keys)?;
            let done = FutureReader::new(&mut access, async move { wasmtime::error::Ok(result) })?;
            Ok((stream, done))
        })
    }
}

impl kv2::Host for SpinView<'_> {}

impl kv2::HostStore for SpinView<'_> {
    async fn open(
        &mut self,
        label: String,
    ) -> wasmtime::Result<Result<Resource<KvStore>, kv2::Error>> {
        Ok(self.open(label)?.map_err(kv2_error))
    }

    async fn get(
        &mut self,
        kv: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, kv2::Error>> {
        let label = self.label(&kv)?;
        Ok(self
            .ctx
            .services
            .kv_get(label, key)
            .await
            .map_err(kv2_error))
    }

    async fn set(
        &mut self,
        kv: Resource<KvStore>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), kv2::Error>> {
        let label = self.label(&kv)?;
        Ok(self
            .ctx
            .services
            .kv_set(label, key, value)
            .await
            .map_err(kv2_error))
    }

    async fn delete(
        &mut self,
        kv: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<(), kv2::Error>> {
        let label = self.label(&kv)?;
        Ok(self
            .ctx
            .services
            .kv_delete(label, key)
            .await
            .map_err(kv2_error))
    }

    async fn exists(
        &mut self,
        kv: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<bool, kv2::Error>> {
        let label = self.label(&kv)?;
        Ok(self
            .ctx
            .services
            .kv_exists(label, key)
            .await
            .map_err(kv2_error))
    }

    async fn get_keys(
        &mut self,
        kv: Resource<KvStore>,
    ) -> wasmtime::Result<Result<Vec<String>, kv2::Error>> {
        let label = self.label(&kv)?;
        Ok(self.ctx.services.kv_keys(label).await.map_err(kv2_error))
    }

    async fn drop(&mut self, kv: Resource<KvStore>) -> wasmtime::Result<()> {
        self.table.delete(kv)?;
        Ok(())
    }
}
