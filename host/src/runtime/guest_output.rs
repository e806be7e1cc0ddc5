//! A guest's stderr, of which the last few bytes are kept: enough for a
//! panic message, never more however much the guest writes.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

#[derive(Clone)]
pub(super) struct GuestOutput {
    tail: Arc<Mutex<VecDeque<u8>>>,
    keep: usize,
}

impl GuestOutput {
    pub(super) fn new(keep: usize) -> GuestOutput {
        GuestOutput {
            tail: Arc::new(Mutex::new(VecDeque::with_capacity(keep))),
            keep,
        }
    }

    fn append(&self, bytes: &[u8]) {
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = &bytes[bytes.len().saturating_sub(self.keep)..];
        let overflow = (tail.len() + bytes.len()).saturating_sub(self.keep);
        tail.drain(..overflow);
        tail.extend(bytes);
    }

    /// What the guest wrote since the last call (its tail), trimmed.
    pub(super) fn take(&self) -> String {
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = tail.drain(..).collect();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
