//! The admin console as its users meet it: a real headless Chromium
//! against the built `laurel up --demo` (real broker, PostgreSQL, Wasm),
//! clicking and typing through each page. Support finds why a blocked
//! photo does not count; a product manager sees an award refused beside
//! the objective it names and dry-runs a change; a function version is
//! pushed as a shadow, diffed, promoted and rolled back; an operator
//! pauses a source while events arrive, resumes it, and replays an event
//! held by a broken function after fixing it; a read token sees every
//! write disabled with the reason, and a forced write refused. No request
//! the page made carries a token in its URL (the browser's network log),
//! and a screenshot of each page is kept.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::browser::Browser;
use crate::support::TestDb;

const OPS: &str = "ops-token-0123456789abcdef";
const VIEWER: &str = "viewer-token-0123456789abcdef";

/// Where the screenshots go; `LAUREL_README_SCREENSHOTS=1` also refreshes
/// the two the README shows (docs/images/).
fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots")
}

struct Up {
    _process: crate::support::KillOnDrop,
    api: String,
    broker: String,
    http: reqwest::Client,
}

impl Up {
    /// `laurel up --demo` with an admin and a read token, once its demo
    /// has run.
    async fn start(db: &TestDb) -> Up {
        let mut process = Command::new(env!("CARGO_BIN_EXE_laurel"))
            .args(["up", "--demo"])
            .env("LAUREL_DATABASE_URL", &db.url)
            .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
            .env("LAUREL_LOG", "warn")
            .env(
                "LAUREL_ADMIN_TOKENS",
                format!("ops:admin:{OPS},viewer:read:{VIEWER}"),
            )
            .env_remove("LAUREL_ADMIN_TOKEN")
            .env_remove("LAUREL_KAFKA_BROKERS")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map(crate::support::KillOnDrop)
            .expect("laurel up --demo starts");
        let stdout = process.0.stdout.take().unwrap();
        let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        let (mut broker, mut api) = (None, None);
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(240))
                .expect("laurel up --demo prints its addresses and its demo");
            if let Some(at) =
                line.strip_prefix("Kafka broker (in process, librdkafka mock cluster): ")
            {
                broker = Some(at.trim().to_string());
            }
            if let Some(at) = line.strip_prefix("HTTP API at ") {
                api = at.split_whitespace().next().map(str::to_string);
            }
            if line.starts_with("  three-of-either  progress") {
                break;
            }
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        Up {
            _process: process,
            api: api.expect("the API's address is printed"),
            broker: broker.expect("the broker's address is printed"),
            http: reqwest::Client::new(),
        }
    }

    /// An admin API read, checked beside what the page shows.
    async fn admin(&self, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}/admin/v1{path}", self.api))
            .bearer_auth(OPS)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
    }

    async fn publish(&self, user: &str, id: &str, kind: &str, photo: &str) {
        let producer = laurel::kafka::producer(&self.broker).unwrap();
        let event = json!({"id": id, "source": "photos", "type": kind, "user_id": user,
            "authorized": true, "content_id": photo, "status": "active",
            "occurred_at": "2026-12-02T10:00:00Z", "payload": {}});
        laurel::kafka::publish(
            &producer,
            "events.photos",
            Some(user.as_bytes()),
            event.to_string().as_bytes(),
            &[],
        )
        .await
        .unwrap();
    }

    /// `user`'s counters for an award's objective, as the admin API has them.
    async fn counter(&self, user: &str, award: &str, objective: &str, counter: &str) -> i64 {
        let awards = self.admin(&format!("/users/{user}/awards")).await;
        awards["awards"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["award_id"] == award)
            .flat_map(|a| a["objectives"].as_array().cloned().unwrap_or_default())
            .find(|o| o["objective_id"] == objective)
            .and_then(|o| o["counters"][counter].as_i64())
            .unwrap_or(0)
    }
}

/// Changes the award in the editor as `change` (JavaScript on `award`)
/// says, as typing would (an input event).
async fn edit_award(browser: &Browser, change: &str) {
    let script = format!(
        "const editor = document.querySelector('textarea');
         const award = JSON.parse(editor.value); {change};
         editor.value = JSON.stringify(award, null, 2);
         editor.dispatchEvent(new Event('input'));"
    );
    browser.run(&script, json!([])).await;
}

/// Every control on the page has a label (its own, `aria-label`, or a
/// button's text).
async fn unlabelled(browser: &Browser, page: &str) {
    let missing = browser
        .run(
            "return [...document.querySelectorAll('input, select, textarea, button')]
               .filter((c) => !(c.labels && c.labels.length) && !c.getAttribute('aria-label')
                 && !(c.tagName === 'BUTTON' && c.innerText.trim()))
               .filter((c) => c.offsetParent !== null)
               .map((c) => c.outerHTML);",
            json!([]),
        )
        .await;
    assert_eq!(missing, json!([]), "controls without a label on {page}");
}

/// A source's row in the console's table, cell by cell.
async fn source_row(browser: &Browser, source: &str) -> Vec<String> {
    let cells = browser
        .run(
            "const row = [...document.querySelectorAll('table[aria-label=\"Sources\"] tbody tr')]
               .find((r) => r.cells[0].innerText === arguments[0]);
             return row ? [...row.cells].map((c) => c.innerText.trim()) : [];",
            json!([source]),
        )
        .await;
    serde_json::from_value(cells).unwrap()
}

async fn wait_for_row(browser: &Browser, source: &str, done: impl Fn(&[String]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let row = source_row(browser, source).await;
        if done(&row) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "source {source}'s row never changed as expected: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn support_product_and_operators_do_their_work_in_the_console() {
    let db = TestDb::new().await;
    let up = Up::start(&db).await;
    let console = format!("{}/console/", up.api);

    // The page's own answer: a strict policy, no inline script or style.
    let page = up.http.get(&console).send().await.unwrap();
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        policy.contains("default-src 'none'") && policy.contains("script-src 'self'"),
        "{policy}"
    );
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    let tag = page.headers()["etag"].to_str().unwrap().to_string();
    let html = page.text().await.unwrap();
    let again = up
        .http
        .get(&console)
        .header("If-None-Match", &tag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304, "the page is asked again by its tag");
    let missing = up
        .http
        .get(format!("{console}%00nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let said = missing.text().await.unwrap();
    assert!(said.contains(r#"the console has no file"#), "{said}");
    assert!(
        html.contains(r#"<script src="console.js" defer></script>"#),
        "{html}"
    );
    assert!(
        !html.contains("style=") && html.matches("<script").count() == 1,
        "{html}"
    );

    let browser = Browser::start(&shots()).await;
    browser.go(&console).await;
    browser.wait_for("Admin token").await;
    browser.screenshot("login").await;
    // The keyboard alone: the token typed, Enter pressed.
    browser
        .type_into("//input[@id='token']", &format!("{OPS}\u{E007}"))
        .await;
    browser.wait_for("ops (admin)").await;
    let kept = browser
        .run(
            "return sessionStorage.getItem('laurel.admin-token');",
            json!([]),
        )
        .await;
    assert_eq!(kept, OPS);
    // An inline script is refused by the policy.
    let injected = browser
        .run(
            "const s = document.createElement('script'); s.textContent = 'window.injected = 1;';
             document.body.append(s); return window.injected === undefined;",
            json!([]),
        )
        .await;
    assert_eq!(injected, true, "an inline script ran");

    // Support: why does u-42's blocked photo not count?
    browser
        .type_into("//input[@name='user']", "u-42\u{E007}")
        .await;
    let user = browser.wait_for("Three of either").await;
    assert!(user.contains("8.5 of 15"), "{user}");
    assert!(user.contains("State: active"), "{user}");
    browser.screenshot("user").await;
    unlabelled(&browser, "the user page").await;
    browser
        .click("//a[@href='#/user/u-42/why/three-of-either']")
        .await;
    let why = browser
        .wait_for("photo-3 (photos) counts nothing: excluded by filter StatusFilter")
        .await;
    assert!(why.contains("photo-1 (photos) counts count 1"), "{why}");
    browser.screenshot("user-why").await;
    browser.click("//a[normalize-space()='← u-42']").await;
    browser.wait_for("Processing log").await;
    // What a user id holds is shown as text, never run as markup.
    browser
        .go(&format!(
            "{console}#/user/{}",
            "%3Cimg%20src%3Dx%20onerror%3D%22window.pwned%3D1%22%3E"
        ))
        .await;
    browser
        .wait_for("User <img src=x onerror=\"window.pwned=1\">")
        .await;
    let pwned = browser
        .run(
            "return window.pwned === undefined && document.querySelectorAll('main img').length === 0;",
            json!([]),
        )
        .await;
    assert_eq!(pwned, true, "a user id ran as markup");
    browser.go(&format!("{console}#/user/u-42")).await;
    browser.wait_for("Three of either").await;
    // Ban, confirmed, then restore.
    browser.press("Ban").await;
    browser.confirm().await;
    browser.wait_for("User u-42 is banned.").await;
    assert_eq!(up.admin("/users/u-42/state").await["state"], "banned");
    browser.press("Restore").await;
    browser.confirm().await;
    browser.wait_for("User u-42 is active.").await;

    // Product: a definition naming an unknown function is refused, with
    // the problem beside its objective; a valid change is dry-run first.
    browser.go(&format!("{console}#/awards")).await;
    browser.wait_for("content-maker").await;
    browser.screenshot("awards").await;
    browser
        .go(&format!("{console}#/awards/three-of-either"))
        .await;
    browser.wait_for("Strategy").await;
    // What the schema refuses is shown before anything is sent.
    edit_award(
        &browser,
        "award.objectives[0].progress_counter = ''; award.objectives[0].colour = 'red'",
    )
    .await;
    browser.press("Apply").await;
    browser
        .wait_for("Not sent: 2 problem(s) against /schemas/award.json")
        .await;
    let beside = browser
        .run(
            "const box = document.querySelector('section[aria-label=\"Objective reviews\"] .problems');
             return box ? box.innerText : null;",
            json!([]),
        )
        .await;
    let beside = beside.as_str().unwrap_or_default();
    assert!(
        beside.contains("/objectives/0/progress_counter must not be empty")
            && beside.contains("/objectives/0 has colour, which is not a field of it"),
        "{beside}"
    );
    browser.screenshot("award-schema").await;
    edit_award(
        &browser,
        "award.objectives[0].progress_counter = 'count'; delete award.objectives[0].colour;
                 award.objectives[1].filters[1].name = 'NoSuchFilter'",
    )
    .await;
    browser.press("Apply").await;
    browser
        .wait_for("no function named NoSuchFilter is registered")
        .await;
    let beside = browser
        .run(
            "const box = document.querySelector('section[aria-label=\"Objective photos\"] .problems');
             return box ? box.innerText : null;",
            json!([]),
        )
        .await;
    assert!(
        beside.as_str().is_some_and(|t| t.contains("NoSuchFilter")),
        "the problem is not beside objective photos: {beside}\n{}",
        browser.text().await
    );
    browser.screenshot("award-refused").await;
    assert_eq!(up.admin("/awards/three-of-either").await["version"], 1);
    // Disabled and enabled again, each confirmed: a new version each time.
    browser.press("Disable").await;
    browser.confirm().await;
    browser.wait_for("Disabled three-of-either (v2).").await;
    assert_eq!(up.admin("/awards/three-of-either").await["enabled"], false);
    browser.press("Enable").await;
    browser.confirm().await;
    browser.wait_for("Enabled three-of-either (v3).").await;
    assert_eq!(up.admin("/awards/three-of-either").await["enabled"], true);
    browser
        .go(&format!("{console}#/awards/content-maker"))
        .await;
    browser.wait_for("Strategy").await;
    edit_award(&browser, "award.strategy.goal = 8").await;
    browser.press("Dry run").await;
    let dry = browser.wait_for("Dry run: nothing written").await;
    assert!(dry.contains("Would complete: u-42."), "{dry}");
    browser.screenshot("award-dry-run").await;
    unlabelled(&browser, "the award editor").await;
    assert_eq!(up.admin("/awards/content-maker").await["version"], 1);

    // A shadow version of StatusFilter (one that lets everything through):
    // pushed from the file picker, diffed, promoted, rolled back.
    let accept_all = laurel::library::guest_dir().join("accept_all_filter.wasm");
    let hostile = laurel::library::guest_dir().join("hostile_filter.wasm");
    browser.go(&format!("{console}#/functions")).await;
    browser.wait_for("StatusFilter").await;
    browser.screenshot("functions").await;
    unlabelled(&browser, "the functions page").await;
    browser
        .go(&format!("{console}#/functions/StatusFilter"))
        .await;
    browser.wait_for("Live: v1.").await;
    browser
        .type_into("//input[@type='file']", &accept_all.display().to_string())
        .await;
    browser.press("Push").await;
    browser
        .wait_for("StatusFilter v2 (filter) pushed, as a shadow")
        .await;
    browser.go(&format!("{console}#/functions")).await;
    browser
        .go(&format!("{console}#/functions/StatusFilter"))
        .await;
    browser.press("Diff v2 against live").await;
    let diff = browser.wait_for("Diff: v2 against live v1").await;
    assert!(diff.contains("three-of-either"), "{diff}");
    let changed: usize = diff
        .lines()
        .find(|l| l.contains("events decided differently"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of events decided differently: {diff}"));
    assert!(
        changed >= 1,
        "the blocked photo is decided differently: {diff}"
    );
    browser.screenshot("function-diff").await;
    browser.press("Promote v2").await;
    browser.confirm().await;
    browser
        .wait_for("StatusFilter: v2 serves now (was v1).")
        .await;
    browser.press("Roll back").await;
    browser.confirm().await;
    browser
        .wait_for("StatusFilter: v1 serves now (was v2).")
        .await;

    // Operations: a paused source holds its events in Kafka; resumed, they
    // are applied.
    browser.go(&format!("{console}#/sources")).await;
    browser.wait_for("events.photos").await;
    browser.press("Pause photos").await;
    browser.confirm().await;
    browser.wait_for("photos paused.").await;
    // Every process pauses within a second of the answer.
    tokio::time::sleep(Duration::from_secs(2)).await;
    up.publish("u-7", "console-1", "photo.status_changed", "photo-71")
        .await;
    up.publish("u-7", "console-2", "photo.status_changed", "photo-72")
        .await;
    wait_for_row(&browser, "photos", |row| {
        row.get(2).is_some_and(|s| s == "paused") && row.get(3).is_some_and(|l| l == "2")
    })
    .await;
    browser.screenshot("sources-paused").await;
    assert_eq!(
        up.counter("u-7", "content-maker", "photo", "approved")
            .await,
        0
    );
    browser.press("Resume photos").await;
    browser.wait_for("photos resumed.").await;
    // The chart's rate moves off zero as the held-back events are applied.
    wait_for_row(&browser, "photos", |row| {
        row.get(4)
            .is_some_and(|rate| !rate.starts_with("0 applied") && rate.contains(" applied, "))
    })
    .await;
    browser.screenshot("sources-resumed").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while up
        .counter("u-7", "content-maker", "photo", "approved")
        .await
        != 2
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "u-7's photos were not applied"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for_row(&browser, "photos", |row| {
        row.get(2).is_some_and(|s| s == "running") && row.get(3).is_some_and(|l| l == "0")
    })
    .await;
    browser.screenshot("sources").await;
    unlabelled(&browser, "the sources page").await;

    // A broken StatusFilter holds an event for the objective that uses it;
    // after the rollback, the replay applies it there, once.
    browser
        .go(&format!("{console}#/functions/StatusFilter"))
        .await;
    browser.wait_for("Live: v1.").await;
    browser
        .type_into("//input[@type='file']", &hostile.display().to_string())
        .await;
    browser.click("//select/option[@value='live']").await;
    browser.press("Push").await;
    browser
        .wait_for("StatusFilter v3 (filter) pushed, live")
        .await;
    up.publish("u-8", "console-3", "loop", "photo-81").await;
    browser.go(&format!("{console}#/sources")).await;
    browser.press("Dead letters of photos").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = browser.text().await;
        if text.contains("three-of-either / photos") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing held:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        browser.press("Dead letters of photos").await;
    }
    browser.screenshot("dead-letters").await;
    assert_eq!(
        up.counter("u-8", "three-of-either", "photos", "count")
            .await,
        0
    );
    browser
        .go(&format!("{console}#/functions/StatusFilter"))
        .await;
    browser.wait_for("Live: v3.").await;
    browser.press("Roll back").await;
    browser.confirm().await;
    browser.wait_for("serves now (was v3).").await;
    browser.go(&format!("{console}#/sources")).await;
    browser.press("Dead letters of photos").await;
    browser.press("Replay photos's dead letters").await;
    browser.confirm().await;
    browser
        .wait_for("photos: 1 replayed, 0 still failing")
        .await;
    assert_eq!(
        up.counter("u-8", "three-of-either", "photos", "count")
            .await,
        1
    );

    // Who did what.
    browser.go(&format!("{console}#/audit")).await;
    let audit = browser
        .wait_for("POST /admin/v1/functions/StatusFilter/promote")
        .await;
    assert!(audit.contains("PUT /admin/v1/users/u-42/state"), "{audit}");
    browser.screenshot("audit").await;
    browser.go(&format!("{console}#/webhooks")).await;
    browser.wait_for("Add or change a webhook").await;
    unlabelled(&browser, "webhooks").await;
    browser
        .type_into("//label[.='Name']/following-sibling::input", "shop")
        .await;
    browser
        .type_into(
            "//label[.='URL']/following-sibling::input",
            "https://shop.example/hooks/awards",
        )
        .await;
    browser.press("Save webhook").await;
    browser.wait_for("Webhook shop saved.").await;
    browser.wait_for("https://shop.example/hooks/awards").await;
    browser.screenshot("webhooks").await;
    assert_eq!(
        up.admin("/webhooks/shop").await["url"],
        "https://shop.example/hooks/awards"
    );

    // A proxy pool: a list imported from the page, each refusal with its
    // reason, then one allocation.
    let proxy = crate::proxy::Tinyproxy::start("console");
    let check = crate::proxy::check_server().await;
    let pool = crate::proxy::pool_name("console");
    let saved = up
        .http
        .put(format!("{}/admin/v1/proxy-pools/{pool}", up.api))
        .bearer_auth(OPS)
        .header("Content-Type", "application/json")
        .body(json!({"check_url": check, "allow_private": true, "timeout_ms": 2000}).to_string())
        .send()
        .await
        .unwrap();
    assert!(
        saved.status().is_success(),
        "{}",
        saved.text().await.unwrap()
    );
    browser.go(&format!("{console}#/pools")).await;
    browser.click(&format!("//a[.='{pool}']")).await;
    browser.wait_for("Import candidates").await;
    let dead = format!("http://127.0.0.1:{}", crate::proxy::free_port());
    browser
        .type_into(
            "//textarea",
            &format!("{}\n{dead}\nnot a proxy\n", proxy.url),
        )
        .await;
    browser.press("Import and check").await;
    let imported = browser.wait_for("1 admitted, 1 refused").await;
    assert!(imported.contains(&format!("{dead}: ")), "{imported}");
    assert!(imported.contains("line 3: "), "{imported}");
    browser.press("Allocate once").await;
    browser.wait_for(&format!("Allocated {}.", proxy.url)).await;
    let chart = browser
        .property("//*[local-name()='svg'][@role='img']", "outerHTML")
        .await;
    assert!(
        chart.as_str().is_some_and(|c| c.contains(&proxy.url)),
        "{chart}"
    );
    unlabelled(&browser, "a proxy pool").await;
    browser.screenshot("pool").await;
    browser.go(&format!("{console}#/pools")).await;
    browser.wait_for(&pool).await;
    browser.screenshot("pools").await;

    // A read token: every write disabled, saying why; a forced one refused.
    browser.press("Log out").await;
    browser
        .type_into("//input[@id='token']", &format!("{VIEWER}\u{E007}"))
        .await;
    browser.wait_for("viewer (read)").await;
    browser.go(&format!("{console}#/sources")).await;
    browser.wait_for("events.photos").await;
    let disabled = browser
        .property("//button[normalize-space()='Pause photos']", "disabled")
        .await;
    assert_eq!(disabled, true);
    let title = browser
        .property("//button[normalize-space()='Pause photos']", "title")
        .await;
    assert_eq!(title, "Token viewer is read-only: writes are refused");
    let note = browser.text().await;
    assert!(
        note.contains("Token viewer is read-only: write controls are disabled"),
        "{note}"
    );
    browser.screenshot("read-only").await;
    // Enabled and clicked at once: the table is redrawn every few seconds.
    browser
        .run(
            "const button = document.evaluate(\"//button[normalize-space()='Pause photos']\",
               document, null, 9, null).singleNodeValue;
             button.disabled = false; button.click();",
            json!([]),
        )
        .await;
    browser.confirm().await;
    browser
        .wait_for("403: token viewer is read-only; POST is a write")
        .await;
    assert_eq!(up.admin("/sources").await["sources"][0]["paused"], false);

    // On a phone: nothing wider than the screen.
    browser.resize(390, 844).await;
    browser.go(&format!("{console}#/user/u-42")).await;
    browser.wait_for("Three of either").await;
    let fits = browser
        .run(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1;",
            json!([]),
        )
        .await;
    assert_eq!(fits, true, "the user page is wider than a phone");
    browser.screenshot("user-phone").await;

    // No request of the page carried a token in its URL; every admin call
    // carried one in its header.
    let requests = browser.requests().await;
    let admin_calls: Vec<_> = requests
        .iter()
        .filter(|(url, _)| url.contains("/admin/v1/"))
        .collect();
    assert!(admin_calls.len() > 20, "{requests:?}");
    for (url, headers) in &requests {
        // The browser's own start page is not the console's.
        if url.starts_with("chrome://") || url.starts_with("about:") {
            continue;
        }
        assert!(
            url.starts_with(&up.api) || url.starts_with("data:"),
            "the page asked something other than Laurel: {url}"
        );
        assert!(
            !url.contains(OPS) && !url.contains(VIEWER) && !url.contains("token"),
            "a request carried a token in its URL: {url}"
        );
        if url.contains("/admin/v1/") {
            let authorization = headers["Authorization"].as_str().unwrap_or_default();
            assert!(authorization.starts_with("Bearer "), "{url}: {headers}");
        }
    }
    if std::env::var_os("LAUREL_README_SCREENSHOTS").is_some() {
        let images = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/images"));
        std::fs::create_dir_all(&images).unwrap();
        for name in ["user-why", "function-diff"] {
            std::fs::copy(
                shots().join(format!("{name}.png")),
                images.join(format!("console-{name}.png")),
            )
            .unwrap();
        }
    }
}
