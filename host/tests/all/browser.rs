//! A real headless Chromium (Debian's `chromium`), driven over W3C WebDriver
//! by its own `chromedriver`: the few commands the console's tests use,
//! each an HTTP call to the driver. Its network log (Chrome's performance
//! log) says what the page requested.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::KillOnDrop;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How W3C WebDriver names an element in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    http: reqwest::Client,
    session: String,
    driver_url: String,
    shots: PathBuf,
    _driver: KillOnDrop,
    profile: PathBuf,
}

impl Browser {
    /// A new browser at 1280x800, with an empty profile; screenshots go
    /// to `shots`.
    pub async fn start(shots: &Path) -> Browser {
        crate::support::debian_packages(&["chromium", "chromium-driver"], || {
            Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists()
        });
        let _ = rustls::crypto::ring::default_provider().install_default();
        let port = crate::owned_postgres::free_port();
        let driver = std::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(KillOnDrop)
            .expect("chromedriver starts");
        let driver_url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while http
            .get(format!("{driver_url}/status"))
            .send()
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not answer on {driver_url}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile =
            std::env::temp_dir().join(format!("laurel-chromium-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).unwrap();
        std::fs::create_dir_all(shots).unwrap();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,800",
                    format!("--user-data-dir={}", profile.display())],
            },
            "goog:loggingPrefs": {"performance": "ALL"},
        }}});
        let answer: Value = serde_json::from_slice(
            &http
                .post(format!("{driver_url}/session"))
                .body(capabilities.to_string())
                .send()
                .await
                .expect("chromedriver takes a session")
                .bytes()
                .await
                .unwrap(),
        )
        .unwrap();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {answer}"))
            .to_string();
        Browser {
            http,
            session,
            driver_url,
            shots: shots.to_path_buf(),
            _driver: driver,
            profile,
        }
    }

    /// One WebDriver command; its `value`, or a panic with the driver's
    /// error.
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.try_command(method, path, body)
            .await
            .unwrap_or_else(|error| panic!("{path}: {error}"))
    }

    /// One WebDriver command: its `value`, or the driver's error.
    async fn try_command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Value> {
        let url = format!("{}/session/{}{path}", self.driver_url, self.session);
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.expect("chromedriver answers");
        let status = response.status();
        let answer: Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(Value::Null);
        if status.is_success() {
            Ok(answer["value"].clone())
        } else {
            Err(answer["value"].clone())
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.command(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn go(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    /// Runs `script` in the page (`arguments` are `args`); its result.
    pub async fn run(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// The page's visible text.
    pub async fn text(&self) -> String {
        self.run("return document.body.innerText;", json!([]))
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Waits until the page's text holds `wanted` (30 s), and returns it.
    pub async fn wait_for(&self, wanted: &str) -> String {
        self.wait_until(wanted, |text| text.contains(wanted)).await
    }

    /// Waits until `done` holds of the page's text (60 s).
    pub async fn wait_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let text = self.text().await;
            if done(&text) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the page never showed {what:?}; it shows:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The element `xpath` finds (waiting for it to appear, 30 s).
    pub async fn find(&self, xpath: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let url = format!("{}/session/{}/elements", self.driver_url, self.session);
            let answer: Value = serde_json::from_slice(
                &self
                    .http
                    .post(&url)
                    .body(json!({"using": "xpath", "value": xpath}).to_string())
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap(),
            )
            .unwrap();
            if let Some(id) = answer["value"][0][ELEMENT].as_str() {
                return id.to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no element {xpath} ({answer}); the page shows:\n{}",
                self.text().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A command on the element `xpath` finds (`/element/ID{path}`); the
    /// element is found again if the page redrew it in between.
    async fn on_element(
        &self,
        xpath: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        for _ in 0..10 {
            let id = self.find(xpath).await;
            match self
                .try_command(
                    method.clone(),
                    &format!("/element/{id}{path}"),
                    body.clone(),
                )
                .await
            {
                Ok(value) => return value,
                Err(error) if error["error"] == "stale element reference" => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => panic!("{xpath}{path}: {error}"),
            }
        }
        panic!("{xpath} was redrawn every time it was used");
    }

    pub async fn click(&self, xpath: &str) {
        self.on_element(xpath, reqwest::Method::POST, "/click", Some(json!({})))
            .await;
    }

    /// Confirms the console's confirmation dialog.
    pub async fn confirm(&self) {
        self.click("//button[@id='confirm-ok']").await;
    }

    /// Clicks the button whose text is `label`.
    pub async fn press(&self, label: &str) {
        self.click(&format!("//button[normalize-space()={label:?}]"))
            .await;
    }

    /// Types `text` into the element (keys as a user presses them; a file
    /// input takes a path).
    pub async fn type_into(&self, xpath: &str, text: &str) {
        let body = Some(json!({"text": text}));
        self.on_element(xpath, reqwest::Method::POST, "/value", body)
            .await;
    }

    /// An attribute or property of the element.
    pub async fn property(&self, xpath: &str, name: &str) -> Value {
        let path = format!("/property/{name}");
        self.on_element(xpath, reqwest::Method::GET, &path, None)
            .await
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .await;
    }

    /// Saves a screenshot of the window as `shots/NAME.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine;
        let data = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().expect("a screenshot is base64"))
            .expect("a screenshot is base64");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Every URL the page requested since the last call (the performance
    /// log's `Network.requestWillBeSent`), with the request's headers.
    pub async fn requests(&self) -> Vec<(String, Value)> {
        let entries = self.post("/se/log", json!({"type": "performance"})).await;
        let mut seen = Vec::new();
        for entry in entries.as_array().cloned().unwrap_or_default() {
            let Some(message) = entry["message"].as_str() else {
                continue;
            };
            let message: Value = serde_json::from_str(message).unwrap_or(Value::Null);
            let message = &message["message"];
            if message["method"] == "Network.requestWillBeSent" {
                let request = &message["params"]["request"];
                if let Some(url) = request["url"].as_str() {
                    seen.push((url.to_string(), request["headers"].clone()));
                }
            }
        }
        seen
    }
}

impl Drop for Browser {
    /// Ends the session, which quits Chromium (killing chromedriver alone
    /// would leave the browser running), then removes its profile.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let address = self.driver_url.trim_start_matches("http://");
        if let Ok(mut socket) = std::net::TcpStream::connect(address) {
            let _ = socket.set_read_timeout(Some(Duration::from_secs(10)));
            let request = format!(
                "DELETE /session/{} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.session
            );
            if socket.write_all(request.as_bytes()).is_ok() {
                let _ = socket.read_to_end(&mut Vec::new());
            }
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
