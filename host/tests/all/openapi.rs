//! The OpenAPI document against what the server answers, both ways: every
//! field a documented body must have is there, and every field an answer
//! has is documented (with its JSON type), for every route's documented
//! JSON answers (reads and writes) and for the error shape. A documented
//! answer the test does not reach fails it too.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::api::{ADMIN, AWARDS, Answer, JWT_SECRET, Server, user_token};
use crate::pipeline_support::{Pipeline, event};

/// What in `value` the schema (of `document`) does not allow, with where.
fn problems(value: &Value, schema: &Value, document: &Value, at: &str) -> Vec<String> {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/schemas/");
        let target = &document["components"]["schemas"][name];
        assert!(
            !target.is_null(),
            "{at}: {reference} is not in the document"
        );
        return problems(value, target, document, at);
    }
    if let Some(alternatives) = schema["oneOf"].as_array() {
        let fits = alternatives
            .iter()
            .any(|alternative| problems(value, alternative, document, at).is_empty());
        return if fits {
            Vec::new()
        } else {
            vec![format!("{at}: {value} fits none of {alternatives:?}")]
        };
    }
    let mut found = Vec::new();
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let is = |t: &str| match t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => true,
    };
    if !types.is_empty() && !types.iter().any(|t| is(t)) {
        found.push(format!("{at}: {value} is not {}", types.join(" or ")));
        return found;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        found.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let Some(object) = value.as_object() {
        let properties = schema["properties"].as_object();
        for required in schema["required"].as_array().into_iter().flatten() {
            let name = required.as_str().unwrap_or_default();
            if !object.contains_key(name) {
                found.push(format!("{at}: the documented field {name} is missing"));
            }
        }
        for (name, field) in object {
            let place = format!("{at}.{name}");
            match properties.and_then(|p| p.get(name)) {
                Some(field_schema) => found.extend(problems(field, field_schema, document, &place)),
                None => match &schema["additionalProperties"] {
                    Value::Object(_) => found.extend(problems(
                        field,
                        &schema["additionalProperties"],
                        document,
                        &place,
                    )),
                    Value::Bool(true) => {}
                    _ if properties.is_none() => {}
                    _ => found.push(format!("{place} is answered but not documented")),
                },
            }
        }
    }
    if let (Some(items), Some(schema)) = (value.as_array(), schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            found.extend(problems(item, schema, document, &format!("{at}[{i}]")));
        }
    }
    found
}

/// Every documented JSON answer of a success: (method, path, status).
fn documented_answers(document: &Value) -> BTreeSet<(String, String, String)> {
    let mut answers = BTreeSet::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let Some(responses) = operation["responses"].as_object() else {
                continue;
            };
            for (status, response) in responses {
                if status.starts_with('2') && !response["content"]["application/json"].is_null() {
                    answers.insert((method.to_uppercase(), path.clone(), status.clone()));
                }
            }
        }
    }
    answers
}

/// A running server and its document; each answer checked against it.
struct Checker {
    server: Server,
    document: Value,
    checked: BTreeSet<(String, String, String)>,
    found: Vec<String>,
}

impl Checker {
    /// Calls `concrete` (an instance of the documented `path`) and holds
    /// the answer to what the document says for its status.
    async fn check(
        &mut self,
        method: &str,
        path: &str,
        concrete: &str,
        token: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Answer {
        let answer = self.server.call(method, concrete, token, body).await;
        let status = answer.status.to_string();
        assert!(
            status.starts_with('2'),
            "{method} {concrete}: {status} {}",
            answer.body
        );
        let schema = &self.document["paths"][path][method.to_lowercase()]["responses"][&status]["content"]
            ["application/json"]["schema"];
        assert!(
            !schema.is_null(),
            "{method} {path} documents no {status} body"
        );
        self.found.extend(problems(
            &answer.body,
            schema,
            &self.document,
            &format!("{method} {concrete}"),
        ));
        self.checked
            .insert((method.to_string(), path.to_string(), status));
        answer
    }

    async fn admin(
        &mut self,
        method: &str,
        path: &str,
        concrete: &str,
        body: Option<Value>,
    ) -> Answer {
        let body = body.map(|b| ("application/json", b.to_string().into_bytes()));
        self.check(
            method,
            &format!("/admin/v1{path}"),
            &format!("/admin/v1{concrete}"),
            Some(ADMIN),
            body,
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_match_the_documented_bodies_both_ways() {
    // Something in every answer: applied and excluded events, a dead
    // letter, items that count and one that does not.
    let mut p = Pipeline::start(AWARDS, &["photos", "reviews"]).await;
    for (n, status) in [(1, "active"), (2, "active"), (3, "blocked")] {
        let photo = event(
            &format!("p-{n}"),
            "photos",
            "u-1",
            Some((&format!("photo-{n}"), status)),
            n,
            json!({}),
        );
        p.send(&photo).await;
    }
    // Too short for the reviews objective: an item that counts nothing.
    let review = json!({"object_id": "firm-1", "text": "short"});
    p.send(&event(
        "r-1",
        "reviews",
        "u-1",
        Some(("review-1", "active")),
        1,
        review,
    ))
    .await;
    p.send_raw("photos", Some(b"u-1"), b"{not json").await;
    p.settle("photos", "u-1").await;
    p.settle("reviews", "u-1").await;
    let server = Server::start(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
    )
    .await;
    let document = server.get("/openapi.json", None).await.body;
    let mut c = Checker {
        server,
        document,
        checked: BTreeSet::new(),
        found: Vec::new(),
    };

    // Writes first, so the reads have them to show.
    let hook = json!({"url": "https://example.com/hook", "events": ["award.completed"]});
    c.admin("PUT", "/webhooks/{name}", "/webhooks/shop", Some(hook))
        .await;
    let navigator = json!({"input_topic": "raw.openapi", "source": "openapi-trips",
        "transform": {"name": "JsonTransform", "config": {"fields": {
            "user_id": "/user", "type": "/event", "authorized": {"const": true},
            "occurred_at": "/ts", "payload": {"distance_m": "/distance"}}}}});
    let applied = c
        .admin(
            "PUT",
            "/pipelines/{name}",
            "/pipelines/navigator",
            Some(navigator),
        )
        .await;
    assert_eq!(applied.body["version"], 1, "{}", applied.body);
    c.admin(
        "POST",
        "/pipelines/{name}/dead-letters/replay",
        "/pipelines/navigator/dead-letters/replay",
        None,
    )
    .await;
    for verb in ["pause", "resume"] {
        c.admin(
            "POST",
            &format!("/pipelines/{{name}}/{verb}"),
            &format!("/pipelines/navigator/{verb}"),
            None,
        )
        .await;
    }
    let award = c.server.admin("GET", "/awards/content-maker", None).await;
    c.admin(
        "PUT",
        "/awards/{id}",
        "/awards/content-maker",
        Some(award.body["definition"].clone()),
    )
    .await;
    let dry = c
        .admin(
            "POST",
            "/awards/{id}/dry-run",
            "/awards/content-maker/dry-run",
            Some(award.body["definition"].clone()),
        )
        .await;
    assert_eq!(
        dry.body["awards"][0]["award_id"], "content-maker",
        "{}",
        dry.body
    );
    let backfill = c
        .admin(
            "POST",
            "/awards/{id}/backfill",
            "/awards/content-maker/backfill",
            None,
        )
        .await;
    assert_eq!(backfill.status, 202, "{}", backfill.body);
    // Three photos and a review are stored.
    assert_eq!(backfill.body["items_total"], 4, "{}", backfill.body);
    assert_eq!(backfill.body["state"], "running", "{}", backfill.body);
    let wasm = crate::support::guest_bytes("accept_all_filter");
    for status in [201, 200] {
        let pushed = c
            .check(
                "PUT",
                "/admin/v1/functions/{name}",
                "/admin/v1/functions/openapi-filter",
                Some(ADMIN),
                Some(("application/wasm", wasm.clone())),
            )
            .await;
        assert_eq!(pushed.status, status, "{}", pushed.body);
    }
    let reject = crate::support::guest_bytes("reject_all_filter");
    let shadow = c
        .check(
            "PUT",
            "/admin/v1/functions/{name}",
            "/admin/v1/functions/openapi-filter?shadow=true",
            Some(ADMIN),
            Some(("application/wasm", reject)),
        )
        .await;
    assert_eq!(shadow.body["live"], false, "{}", shadow.body);
    let diff = c
        .admin(
            "GET",
            "/functions/{name}/diff",
            "/functions/openapi-filter/diff",
            None,
        )
        .await;
    assert_eq!(diff.body["candidate_version"], 2, "{}", diff.body);
    let promoted = c
        .admin(
            "POST",
            "/functions/{name}/promote",
            "/functions/openapi-filter/promote",
            Some(json!({"version": 2})),
        )
        .await;
    assert_eq!(promoted.body["to"], 2, "{}", promoted.body);
    let back = c
        .admin(
            "POST",
            "/functions/{name}/rollback",
            "/functions/openapi-filter/rollback",
            None,
        )
        .await;
    assert_eq!(
        (&back.body["from"], &back.body["to"]),
        (&json!(2), &json!(1))
    );
    let component = c
        .server
        .call(
            "GET",
            "/admin/v1/functions/openapi-filter/versions/1",
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(component.status, 200);
    for (name, text) in laurel::api::SCHEMAS {
        let served = c
            .server
            .call("GET", &format!("/schemas/{name}"), None, None)
            .await;
        assert_eq!(served.status, 200, "{name}");
        assert_eq!(served.content_type, "application/schema+json", "{name}");
        assert_eq!(
            served.body,
            serde_json::from_str::<Value>(text).unwrap(),
            "{name}"
        );
    }
    let missing = c.server.call("GET", "/schemas/nope.json", None, None).await;
    assert_eq!(missing.status, 404);
    c.admin(
        "POST",
        "/sources/{name}/pause",
        "/sources/photos/pause",
        None,
    )
    .await;
    c.admin(
        "POST",
        "/sources/{name}/resume",
        "/sources/photos/resume",
        None,
    )
    .await;
    c.admin(
        "POST",
        "/sources/{name}/dead-letters/replay",
        "/sources/photos/dead-letters/replay",
        None,
    )
    .await;
    let pool = crate::proxy::pool_name("openapi");
    let check_url = crate::proxy::check_server().await;
    let settings = json!({"check_url": check_url, "allow_private": true});
    c.admin(
        "PUT",
        "/proxy-pools/{pool}",
        &format!("/proxy-pools/{pool}"),
        Some(settings),
    )
    .await;
    let live = crate::proxy::Tinyproxy::start("openapi");
    let list = format!(
        "http://127.0.0.1:{}\nhttp://127.0.0.1:{}\nnot a proxy\n",
        live.port(),
        crate::proxy::free_port()
    );
    let imported = c
        .check(
            "PUT",
            "/admin/v1/proxy-pools/{pool}/candidates",
            &format!("/admin/v1/proxy-pools/{pool}/candidates"),
            Some(ADMIN),
            Some(("text/plain", list.into_bytes())),
        )
        .await;
    for part in ["admitted", "refused", "junk"] {
        assert_eq!(
            imported.body[part].as_array().map(Vec::len),
            Some(1),
            "{part}: {}",
            imported.body
        );
    }
    c.admin(
        "POST",
        "/proxy-pools/{pool}/allocate",
        &format!("/proxy-pools/{pool}/allocate"),
        None,
    )
    .await;

    let user = user_token("u-1", JWT_SECRET, 600);
    c.check(
        "GET",
        "/v1/users/{user_id}/awards",
        "/v1/users/u-1/awards",
        Some(&user),
        None,
    )
    .await;
    let choice = |public: bool| {
        Some((
            "application/json",
            json!({"public": public}).to_string().into_bytes(),
        ))
    };
    c.check(
        "PUT",
        "/v1/users/{user_id}/badges",
        "/v1/users/u-1/badges",
        Some(&user),
        choice(false),
    )
    .await;
    c.check(
        "GET",
        "/v1/users/{user_id}/badges",
        "/v1/users/u-1/badges",
        Some(&user),
        None,
    )
    .await;
    c.admin(
        "PUT",
        "/users/{user_id}/badges",
        "/users/u-1/badges",
        Some(json!({"public": true})),
    )
    .await;
    c.admin("GET", "/users/{user_id}/badges", "/users/u-1/badges", None)
        .await;
    // A user banned and restored (u-9: u-1's awards are read below).
    for state in ["banned", "active"] {
        let set = c
            .admin(
                "PUT",
                "/users/{user_id}/state",
                "/users/u-9/state",
                Some(json!({"state": state})),
            )
            .await;
        assert_eq!(set.body["state"], state, "{}", set.body);
    }
    let reads = [
        ("/whoami", "/whoami"),
        ("/users/{user_id}/state", "/users/u-9/state"),
        ("/proxy-pools", "/proxy-pools"),
        ("/pipelines", "/pipelines"),
        ("/pipelines/{name}", "/pipelines/navigator"),
        ("/awards", "/awards"),
        ("/awards/{id}", "/awards/content-maker"),
        ("/functions", "/functions"),
        ("/users/{user_id}/awards", "/users/u-1/awards"),
        ("/users/{user_id}/log", "/users/u-1/log"),
        (
            "/users/{user_id}/awards/{award_id}/explain",
            "/users/u-1/awards/content-maker/explain",
        ),
        ("/sources", "/sources"),
        (
            "/sources/{name}/dead-letters",
            "/sources/photos/dead-letters?all=true",
        ),
        ("/audit", "/audit"),
        ("/proxy-pools/{pool}", &format!("/proxy-pools/{pool}")),
        ("/webhooks", "/webhooks"),
        ("/webhooks/{name}", "/webhooks/shop"),
    ];
    let mut answers = Vec::new();
    for (path, concrete) in reads {
        answers.push(c.admin("GET", path, concrete, None).await.body);
    }
    c.check("GET", "/healthz", "/healthz", None, None).await;
    // The answers had something in them to check.
    let [.., log, explain, _, letters, audit, pool_view, _, _] = &answers[..] else {
        unreachable!()
    };
    assert!(
        log["entries"].as_array().is_some_and(|e| e.len() >= 4),
        "{log}"
    );
    let [photo, reviews, ..] = &explain["objectives"].as_array().unwrap()[..] else {
        panic!("{explain}")
    };
    assert!(
        !photo["contributing"].as_array().unwrap().is_empty(),
        "{explain}"
    );
    assert!(
        !reviews["not_contributing"].as_array().unwrap().is_empty(),
        "{explain}"
    );
    assert_eq!(
        letters["dead_letters"].as_array().map(Vec::len),
        Some(1),
        "{letters}"
    );
    assert!(!audit["entries"].as_array().unwrap().is_empty(), "{audit}");
    assert!(!pool_view["config"].is_null(), "{pool_view}");
    assert_eq!(
        pool_view["members"].as_array().map(Vec::len),
        Some(2),
        "{pool_view}"
    );

    // The error shape, as every route answers it, with a refusal's problems.
    let missing = c.server.get("/admin/v1/awards/nope", Some(ADMIN)).await;
    assert_eq!(missing.status, 404);
    let error = json!({"$ref": "#/components/schemas/Error"});
    c.found
        .extend(problems(&missing.body, &error, &c.document, "404"));
    let broken = json!({"title": "x", "objectives": [{"id": "o", "filters": ["no-such-filter"], "rule": "count"}]});
    let refused = c.server.admin("PUT", "/awards/broken", Some(broken)).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(
        refused.body["problems"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{}",
        refused.body
    );
    c.found
        .extend(problems(&refused.body, &error, &c.document, "422"));
    let broken =
        json!({"input_topic": "events.x", "source": "s", "transform": {"name": "NoSuchTransform"}});
    let refused = c
        .server
        .admin("PUT", "/pipelines/broken", Some(broken))
        .await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert_eq!(
        refused.body["problems"].as_array().map(Vec::len),
        Some(2),
        "{}",
        refused.body
    );
    c.found
        .extend(problems(&refused.body, &error, &c.document, "422 pipeline"));
    assert!(c.found.is_empty(), "{}", c.found.join("\n"));

    let unchecked: Vec<_> = documented_answers(&c.document)
        .difference(&c.checked)
        .cloned()
        .collect();
    assert!(
        unchecked.is_empty(),
        "documented answers no test checks: {unchecked:?}"
    );

    // The check itself catches both directions.
    let extra = json!({"user_id": "u", "awards": [], "surprise": 1});
    let schema = json!({"$ref": "#/components/schemas/UserAwards"});
    assert_eq!(
        problems(&extra, &schema, &c.document, "x"),
        ["x.surprise is answered but not documented"]
    );
    assert_eq!(
        problems(&json!({"awards": []}), &schema, &c.document, "x"),
        ["x: the documented field user_id is missing"]
    );
    let server = c.server;
    server
        .admin("DELETE", &format!("/proxy-pools/{pool}"), None)
        .await;
    drop(server);
    p.stop().await;
}
