//! Compiled components on disk, keyed by the component's sha256 and the
//! engine's compatibility hash, so a restart (or another process on the same
//! machine) doesn't compile a component again.
//!
//! Trust: a cached artifact is native code that is loaded without
//! validation. The cache directory must be writable only by Laurel's user.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use tracing::{debug, warn};
use wasmtime::Engine;
use wasmtime::component::Component;

pub(super) struct CompileCache {
    dir: PathBuf,
    engine: Engine,
    engine_key: String,
}

impl CompileCache {
    pub(super) fn new(dir: PathBuf, engine: &Engine) -> CompileCache {
        // DefaultHasher::new() uses fixed keys: the same engine hashes the
        // same in every process of this binary. Hashed again for a short name.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let digest = Sha256::digest(hasher.finish().to_le_bytes());
        let engine_key = hex::encode(&digest[..8]);
        CompileCache {
            dir,
            engine: engine.clone(),
            engine_key,
        }
    }

    pub(super) fn load_or_compile(
        &self,
        sha256: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<Component> {
        let path = self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key));
        // Read, not mmap (`deserialize_file`): a file replaced or truncated
        // under a running process must not take it down.
        if let Ok(artifact) = std::fs::read(&path) {
            // SAFETY: the file was written by `serialize` below for this
            // engine configuration (its name carries the compatibility hash)
            // into a directory only Laurel writes; wasmtime still checks the
            // header and refuses an artifact of another engine.
            match unsafe { Component::deserialize(&self.engine, &artifact) } {
                Ok(component) => {
                    debug!(message = "Loaded a compiled component from the cache.", path = %path.display());
                    return Ok(component);
                }
                Err(error) => {
                    warn!(message = "Ignoring an unusable compiled component.", path = %path.display(), error = %format!("{error:#}"));
                }
            }
        }
        let component = Component::new(&self.engine, bytes)?;
        if let Err(error) = self.store(&path, &component) {
            warn!(message = "Failed to cache a compiled component.", path = %path.display(), %error);
        }
        Ok(component)
    }

    fn store(&self, path: &std::path::Path, component: &Component) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let bytes = component
            .serialize()
            .map_err(|e| anyhow::anyhow!("{e:#}"))?;
        // Write then rename: a concurrent reader never sees half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }
}
