//! The API's one error type, and the one place that maps errors to HTTP
//! status codes and JSON bodies (`{"error": "..."}`, plus `problems` for a
//! refused definition).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::error;

use crate::definitions::DefinitionError;
use crate::pipelines::PipelineProblem;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The request did not arrive in time (a slow or stalled client).
    #[error("{0}")]
    RequestTimeout(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A well-formed request Laurel refuses (an invalid definition, a
    /// component that does not load), with each problem.
    #[error("{message}")]
    Unprocessable {
        message: String,
        problems: Vec<Problem>,
    },
    /// A backing service (PostgreSQL, Redis, Kafka) is not answering.
    #[error("{0}")]
    Unavailable(String),
    /// As much heavy work is running as the API takes at once: try again.
    #[error("{0}")]
    TooManyRequests(String),
    /// An HTTP function failed (trapped, answered with an error).
    #[error("{0}")]
    BadGateway(String),
    /// An HTTP function did not answer in time.
    #[error("{0}")]
    GatewayTimeout(String),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

/// Every error's body: `{"error": "..."}`, with `problems` for a refused
/// definition.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
}

/// One thing wrong with a refused definition, as data and in words.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Problem {
    Award {
        award: String,
        objective: Option<String>,
        function: Option<String>,
        reason: String,
        message: String,
    },
    Pipeline {
        pipeline: String,
        reason: String,
        message: String,
    },
}

impl From<&DefinitionError> for Problem {
    fn from(problem: &DefinitionError) -> Problem {
        Problem::Award {
            award: problem.award.clone(),
            objective: problem.objective.clone(),
            function: problem.function.clone(),
            reason: problem.reason.clone(),
            message: problem.to_string(),
        }
    }
}

impl From<&PipelineProblem> for Problem {
    fn from(problem: &PipelineProblem) -> Problem {
        Problem::Pipeline {
            pipeline: problem.pipeline.clone(),
            reason: problem.reason.clone(),
            message: problem.to_string(),
        }
    }
}

impl ApiError {
    /// A refusal naming each problem with a definition.
    pub fn refused(message: impl Into<String>, problems: &[DefinitionError]) -> ApiError {
        ApiError::Unprocessable {
            message: message.into(),
            problems: problems.iter().map(Problem::from).collect(),
        }
    }

    /// A refusal naming each problem with a pipeline definition.
    pub fn refused_pipeline(message: impl Into<String>, problems: &[PipelineProblem]) -> ApiError {
        ApiError::Unprocessable {
            message: message.into(),
            problems: problems.iter().map(Problem::from).collect(),
        }
    }

    pub fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::Unprocessable {
            message: message.into(),
            problems: Vec::new(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::GatewayTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> Self {
        use crate::store::StoreError;
        match error {
            StoreError::Connect { .. } => ApiError::Unavailable(error.to_string()),
            StoreError::Query { ref source, .. } if source.is_closed() => {
                ApiError::Unavailable(error.to_string())
            }
            other => ApiError::Unexpected(other.into()),
        }
    }
}

impl From<crate::runtime::http::HttpFunctionError> for ApiError {
    fn from(error: crate::runtime::http::HttpFunctionError) -> Self {
        use crate::runtime::http::HttpFunctionError;
        match error {
            HttpFunctionError::RequestTooLarge(_) => ApiError::PayloadTooLarge(error.to_string()),
            HttpFunctionError::Timeout { .. } => ApiError::GatewayTimeout(error.to_string()),
            HttpFunctionError::Failed { .. } | HttpFunctionError::ResponseTooLarge { .. } => {
                ApiError::BadGateway(error.to_string())
            }
        }
    }
}

impl From<crate::store::StorePoolError> for ApiError {
    fn from(error: crate::store::StorePoolError) -> Self {
        match error {
            crate::store::StorePoolError::Busy(_) => ApiError::Unavailable(error.to_string()),
            crate::store::StorePoolError::Store(error) => error.into(),
        }
    }
}

impl From<crate::proxy::ProxyError> for ApiError {
    fn from(error: crate::proxy::ProxyError) -> Self {
        use crate::proxy::ProxyError;
        match error {
            ProxyError::InvalidPool(_) => ApiError::BadRequest(error.to_string()),
            ProxyError::Redis { .. } | ProxyError::InvalidUrl { .. } => {
                ApiError::Unavailable(error.to_string())
            }
        }
    }
}

impl From<crate::proxy::ProxyPoolError> for ApiError {
    fn from(error: crate::proxy::ProxyPoolError) -> Self {
        use crate::proxy::ProxyPoolError;
        match error {
            ProxyPoolError::Unknown(_) => ApiError::NotFound(error.to_string()),
            ProxyPoolError::Redis(error) => error.into(),
            ProxyPoolError::Store(error) => error.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match self {
            ApiError::Unexpected(error) => {
                // The details are for the operator's log, not the caller.
                error!(message = "Request failed.", error = %format!("{error:#}"));
                ErrorBody {
                    error: "internal error (details are in Laurel's log)".into(),
                    problems: Vec::new(),
                }
            }
            ApiError::Unprocessable { message, problems } => ErrorBody {
                error: message,
                problems,
            },
            other => ErrorBody {
                error: other.to_string(),
                problems: Vec::new(),
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
