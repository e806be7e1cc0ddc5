//! Users' tokens on a real server: claims checked by their types (a string
//! or float `exp`, a missing one when required), issuer and audience, and
//! RS256/ES256 tokens verified with an identity provider's JWKS, from a
//! file and from a URL, without letting a token choose the wrong key.

use std::path::PathBuf;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use laurel::api::{Secret, TokenSettings};
use serde_json::{Value, json};

use crate::api::{JWT_SECRET, Server, database_with, error_text};

const PATH: &str = "/v1/users/u-1/awards";

fn keys_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys"))
}

fn hs256(claims: Value) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap()
}

fn signed(algorithm: Algorithm, kid: Option<&str>, claims: Value) -> String {
    let key = match algorithm {
        Algorithm::RS256 => {
            EncodingKey::from_rsa_der(&std::fs::read(keys_dir().join("rsa.der")).unwrap())
        }
        Algorithm::ES256 => {
            EncodingKey::from_ec_der(&std::fs::read(keys_dir().join("ec.pk8.der")).unwrap())
        }
        other => panic!("no test key for {other:?}"),
    };
    let mut header = Header::new(algorithm);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

async fn start(adjust: impl FnOnce(&mut TokenSettings)) -> (Server, crate::support::TestDb) {
    let (db, registry) = database_with(crate::api::AWARDS).await;
    let server = Server::start_custom(&db.url, registry, None, None, |settings| {
        adjust(&mut settings.tokens)
    })
    .await
    .unwrap();
    (server, db)
}

/// The answer's status and error text (empty for a 200).
async fn answer(server: &Server, token: &str) -> (u16, String) {
    let answer = server.get(PATH, Some(token)).await;
    let text = if answer.status == 200 {
        String::new()
    } else {
        error_text(&answer).to_string()
    };
    (answer.status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exp_must_be_a_number_and_can_be_required() {
    let (server, db) = start(|_| {}).await;
    let cases = [
        // A string exp used to skip the expiry check altogether.
        (
            json!({"sub": "u-1", "exp": "2001-01-01"}),
            401,
            "`exp` must be a number",
        ),
        (
            json!({"sub": "u-1", "exp": (now() - 3600) as f64 + 0.5}),
            401,
            "it has expired",
        ),
        (
            json!({"sub": "u-1", "exp": (now() + 3600) as f64 + 0.5}),
            200,
            "",
        ),
        (
            json!({"sub": "u-1", "exp": now() - 3600}),
            401,
            "it has expired",
        ),
        // Within the documented leeway (60 s) of its exp: still valid.
        (json!({"sub": "u-1", "exp": now() - 30}), 200, ""),
        (json!({"sub": "u-1"}), 200, ""),
        (
            json!({"sub": "u-1", "nbf": now() + 3600}),
            401,
            "not valid yet",
        ),
        (
            json!({"sub": "u-1", "nbf": "soon"}),
            401,
            "`nbf` must be a number",
        ),
        (json!({"sub": 42}), 401, "`sub` must be a non-empty string"),
        (json!({"exp": now() + 60}), 401, "it has no `sub`"),
    ];
    for (claims, status, text) in &cases {
        let (got, error) = answer(&server, &hs256(claims.clone())).await;
        assert_eq!(got, *status, "{claims}: {error}");
        assert!(error.contains(text), "{claims}: {error}");
    }
    drop(server);
    db.drop_database().await;

    let (server, db) = start(|t| {
        t.secret = Some(Secret::new(JWT_SECRET));
        t.require_exp = true;
    })
    .await;
    let (status, error) = answer(&server, &hs256(json!({"sub": "u-1"}))).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid token: it has no `exp`")
    );
    let (status, _) = answer(&server, &hs256(json!({"sub": "u-1", "exp": now() + 60}))).await;
    assert_eq!(status, 200);
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issuer_and_audience_can_be_required() {
    let (server, db) = start(|t| {
        t.issuer = Some("https://login.example".into());
        t.audience = Some("laurel".into());
    })
    .await;
    let exp = now() + 600;
    for (claims, status, text) in [
        (
            json!({"sub": "u-1", "exp": exp}),
            401,
            "`iss` must be \"https://login.example\"",
        ),
        (
            json!({"sub": "u-1", "exp": exp, "iss": "https://evil.example", "aud": "laurel"}),
            401,
            "`iss` must be",
        ),
        (
            json!({"sub": "u-1", "exp": exp, "iss": "https://login.example", "aud": "other"}),
            401,
            "`aud` must name \"laurel\"",
        ),
        (
            json!({"sub": "u-1", "exp": exp, "iss": "https://login.example"}),
            401,
            "`aud` must name",
        ),
        (
            json!({"sub": "u-1", "exp": exp, "iss": "https://login.example", "aud": "laurel"}),
            200,
            "",
        ),
        (
            json!({"sub": "u-1", "exp": exp, "iss": "https://login.example", "aud": ["web", "laurel"]}),
            200,
            "",
        ),
    ] {
        let (got, error) = answer(&server, &hs256(claims.clone())).await;
        assert_eq!(got, status, "{claims}: {error}");
        assert!(error.contains(text), "{claims}: {error}");
    }
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_and_es256_tokens_are_verified_with_a_jwks_file() {
    let jwks = keys_dir().join("jwks.json").display().to_string();
    let (server, db) = start(|t| {
        t.secret = None;
        t.jwks = Some(jwks);
    })
    .await;
    let claims = json!({"sub": "u-1", "exp": now() + 600});
    // Keys load in the background at start.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while answer(
        &server,
        &signed(Algorithm::RS256, Some("rsa-1"), claims.clone()),
    )
    .await
    .0 != 200
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the JWKS never loaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        answer(
            &server,
            &signed(Algorithm::ES256, Some("ec-1"), claims.clone())
        )
        .await
        .0,
        200
    );
    // Without a kid: any key of the right type.
    assert_eq!(
        answer(&server, &signed(Algorithm::ES256, None, claims.clone()))
            .await
            .0,
        200
    );
    // Another user's token.
    let other = signed(
        Algorithm::RS256,
        Some("rsa-1"),
        json!({"sub": "u-2", "exp": now() + 600}),
    );
    assert_eq!(answer(&server, &other).await.0, 403);
    // The wrong key for the kid, an unknown kid, and HS256 with no secret.
    let (status, error) = answer(
        &server,
        &signed(Algorithm::RS256, Some("ec-1"), claims.clone()),
    )
    .await;
    assert_eq!(status, 401, "{error}");
    assert!(error.contains("no RS256 key with kid \"ec-1\""), "{error}");
    let (status, error) = answer(
        &server,
        &signed(Algorithm::ES256, Some("nope"), claims.clone()),
    )
    .await;
    assert_eq!(status, 401, "{error}");
    let (status, error) = answer(&server, &hs256(claims.clone())).await;
    assert_eq!(
        (status, error.as_str()),
        (
            401,
            "invalid token: HS256 tokens are not accepted here (no shared secret is set)"
        )
    );
    // A token whose claims were changed after signing: another token's
    // claims under this one's signature.
    let token = signed(Algorithm::ES256, Some("ec-1"), claims.clone());
    let longer = signed(
        Algorithm::ES256,
        Some("ec-1"),
        json!({"sub": "u-1", "exp": now() + 999_999}),
    );
    let mut parts: Vec<&str> = token.split('.').collect();
    parts[1] = longer.split('.').nth(1).unwrap();
    let (status, error) = answer(&server, &parts.join(".")).await;
    assert_eq!(status, 401, "{error}");
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_is_fetched_and_hs256_cannot_borrow_a_public_key() {
    use axum::routing::get;
    let jwks: Value =
        serde_json::from_slice(&std::fs::read(keys_dir().join("jwks.json")).unwrap()).unwrap();
    let app = axum::Router::new().route(
        "/jwks.json",
        get(move || {
            let jwks = jwks.clone();
            async move { axum::Json(jwks) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (server, db) = start(|t| {
        t.jwks = Some(url);
    })
    .await;
    let claims = json!({"sub": "u-1", "exp": now() + 600});
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while answer(
        &server,
        &signed(Algorithm::ES256, Some("ec-1"), claims.clone()),
    )
    .await
    .0 != 200
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the JWKS URL was never read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // An HS256 token signed with the RSA key's public modulus as the
    // "secret" (the classic confusion): HS256 only ever uses the secret.
    let keys: Value =
        serde_json::from_slice(&std::fs::read(keys_dir().join("jwks.json")).unwrap()).unwrap();
    let public = keys["keys"][0]["n"].as_str().unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("rsa-1".into());
    let confused = jsonwebtoken::encode(
        &header,
        &claims,
        &EncodingKey::from_secret(public.as_bytes()),
    )
    .unwrap();
    let (status, error) = answer(&server, &confused).await;
    assert_eq!(status, 401, "{error}");
    assert!(error.contains("InvalidSignature"), "{error}");
    drop(server);
    db.drop_database().await;
}
