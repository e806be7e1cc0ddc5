//! Compiled components on disk, keyed by the component's sha256 (computed
//! from its bytes at every load, never taken from a caller) and the
//! engine's compatibility hash, so a restart (or another process on the
//! same machine) doesn't compile a component again.
//!
//! Trust: a cached artifact is native code, loaded without validation by
//! wasmtime. So the directory must be Laurel's alone: it is made with mode
//! 0700, an existing one is tightened to 0700 if Laurel's user owns it and
//! refused (components are compiled every time, with a warning) if another
//! user does. Each artifact ends with a digest of its bytes and the
//! component's sha256: a file changed on disk (tampered, truncated, or
//! compiled from other bytes) is recompiled and replaced, not loaded.

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tracing::{debug, warn};
use wasmtime::Engine;
use wasmtime::component::Component;

pub(super) struct CompileCache {
    dir: PathBuf,
    engine: Engine,
    engine_key: String,
}

/// Length of the digest that ends every artifact.
const DIGEST: usize = 32;

impl CompileCache {
    /// The cache in `dir`, or `None` (with a warning) if `dir` is not
    /// Laurel's alone and cannot be made so.
    pub(super) fn new(dir: PathBuf, engine: &Engine) -> Option<CompileCache> {
        if let Err(reason) = private_dir(&dir) {
            warn!(message = "Not caching compiled components: the cache directory is not Laurel's alone.", dir = %dir.display(), %reason);
            return None;
        }
        // DefaultHasher::new() uses fixed keys: the same engine hashes the
        // same in every process of this binary. Hashed again for a short name.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let digest = Sha256::digest(hasher.finish().to_le_bytes());
        let engine_key = hex::encode(&digest[..8]);
        Some(CompileCache {
            dir,
            engine: engine.clone(),
            engine_key,
        })
    }

    /// The compiled component for `bytes`, whose sha256 is `sha256`.
    pub(super) fn load_or_compile(
        &self,
        sha256: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<Component> {
        let path = self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key));
        // Read, not mmap (`deserialize_file`): a file replaced or truncated
        // under a running process must not take it down.
        if let Ok(file) = std::fs::read(&path) {
            match checked(&file, sha256) {
                // SAFETY: the artifact's digest matches what `store` wrote
                // for this component and engine (the name carries the
                // compatibility hash) into a directory only Laurel's user
                // can write; wasmtime still checks the header and refuses an
                // artifact of another engine.
                Some(artifact) => match unsafe { Component::deserialize(&self.engine, artifact) } {
                    Ok(component) => {
                        debug!(message = "Loaded a compiled component from the cache.", path = %path.display());
                        return Ok(component);
                    }
                    Err(error) => {
                        warn!(message = "Ignoring an unusable compiled component.", path = %path.display(), error = %format!("{error:#}"));
                    }
                },
                None => {
                    warn!(message = "A cached compiled component does not match its digest (changed on disk); compiling it again.", path = %path.display());
                }
            }
        }
        let component = Component::new(&self.engine, bytes)?;
        if let Err(error) = self.store(&path, sha256, &component) {
            warn!(message = "Failed to cache a compiled component.", path = %path.display(), %error);
        }
        Ok(component)
    }

    fn store(&self, path: &Path, sha256: &str, component: &Component) -> anyhow::Result<()> {
        let mut bytes = component
            .serialize()
            .map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let digest = digest(&bytes, sha256);
        bytes.extend_from_slice(&digest);
        // Write then rename: a concurrent reader never sees half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }
}

fn digest(artifact: &[u8], sha256: &str) -> [u8; DIGEST] {
    let mut hasher = Sha256::new();
    hasher.update(b"laurel compiled component v1\0");
    hasher.update(sha256.as_bytes());
    hasher.update(artifact);
    hasher.finalize().into()
}

/// The artifact in `file` if its trailing digest matches it and `sha256`.
fn checked<'a>(file: &'a [u8], sha256: &str) -> Option<&'a [u8]> {
    let split = file.len().checked_sub(DIGEST)?;
    let (artifact, trailer) = file.split_at(split);
    (digest(artifact, sha256) == trailer).then_some(artifact)
}

/// Makes `dir` (mode 0700) or checks that it is Laurel's user's alone,
/// tightening its mode if it is ours.
fn private_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create it: {e}"))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot set its mode: {e}"))?;
        return Ok(());
    }
    let metadata = std::fs::metadata(dir).map_err(|e| format!("cannot read it: {e}"))?;
    if !metadata.is_dir() {
        return Err("it is not a directory".to_string());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if metadata.uid() != uid {
        return Err(format!(
            "it belongs to user {} and Laurel runs as user {uid}",
            metadata.uid()
        ));
    }
    if metadata.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            format!(
                "its mode is {:o} (others may write) and cannot be set to 700: {e}",
                metadata.mode() & 0o777
            )
        })?;
        warn!(message = "The cache directory's mode was too open; set to 700.", dir = %dir.display());
    }
    Ok(())
}
