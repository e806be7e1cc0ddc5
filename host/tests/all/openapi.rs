//! The OpenAPI document against what the server answers, both ways: every
//! field a documented body must have is there, and every field an answer
//! has is documented (with its JSON type), for each GET route's 200 and
//! for the error shape.

use serde_json::{Value, json};

use crate::api::{ADMIN, AWARDS, JWT_SECRET, Server, database_with, user_token};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_match_the_documented_bodies_both_ways() {
    let (db, registry) = database_with(AWARDS).await;
    let server = Server::start(&db.url, registry, None).await;
    let document = server.get("/openapi.json", None).await.body;
    let hook = json!({"url": "https://example.com/hook", "events": ["award.completed"]});
    assert_eq!(
        server
            .admin("PUT", "/webhooks/shop", Some(hook))
            .await
            .status,
        200
    );

    let user = user_token("u-1", JWT_SECRET, 600);
    let gets: &[(&str, &str, Option<&str>)] = &[
        (
            "/v1/users/{user_id}/awards",
            "/v1/users/u-1/awards",
            Some(&user),
        ),
        ("/admin/v1/awards", "/admin/v1/awards", Some(ADMIN)),
        (
            "/admin/v1/awards/{id}",
            "/admin/v1/awards/content-maker",
            Some(ADMIN),
        ),
        ("/admin/v1/functions", "/admin/v1/functions", Some(ADMIN)),
        (
            "/admin/v1/users/{user_id}/awards",
            "/admin/v1/users/u-1/awards",
            Some(ADMIN),
        ),
        (
            "/admin/v1/users/{user_id}/log",
            "/admin/v1/users/u-1/log",
            Some(ADMIN),
        ),
        (
            "/admin/v1/users/{user_id}/awards/{award_id}/explain",
            "/admin/v1/users/u-1/awards/content-maker/explain",
            Some(ADMIN),
        ),
        ("/admin/v1/sources", "/admin/v1/sources", Some(ADMIN)),
        ("/admin/v1/webhooks", "/admin/v1/webhooks", Some(ADMIN)),
        (
            "/admin/v1/webhooks/{name}",
            "/admin/v1/webhooks/shop",
            Some(ADMIN),
        ),
    ];
    let mut found = Vec::new();
    for (documented, concrete, token) in gets {
        let answer = server.get(concrete, *token).await;
        assert_eq!(answer.status, 200, "GET {concrete}: {}", answer.body);
        let schema = &document["paths"][documented]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"];
        assert!(!schema.is_null(), "GET {documented} documents no 200 body");
        found.extend(problems(
            &answer.body,
            schema,
            &document,
            &format!("GET {concrete}"),
        ));
    }
    // The error shape, as every route answers it.
    let missing = server.get("/admin/v1/awards/nope", Some(ADMIN)).await;
    assert_eq!(missing.status, 404);
    let error = json!({"$ref": "#/components/schemas/Error"});
    found.extend(problems(&missing.body, &error, &document, "404"));
    assert!(found.is_empty(), "{}", found.join("\n"));

    // The check itself catches both directions.
    let extra = json!({"user_id": "u", "awards": [], "surprise": 1});
    let schema = json!({"$ref": "#/components/schemas/UserAwards"});
    assert_eq!(
        problems(&extra, &schema, &document, "x"),
        ["x.surprise is answered but not documented"]
    );
    assert_eq!(
        problems(&json!({"awards": []}), &schema, &document, "x"),
        ["x: the documented field user_id is missing"]
    );
    drop(server);
    db.drop_database().await;
}
