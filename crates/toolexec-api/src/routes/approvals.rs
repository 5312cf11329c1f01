//! Deciding calls that wait for a person (a session's `policy.approval`).
use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::json;
use toolexec_core::Invocation;
use toolexec_engine::Decision;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::{ApiJson, parse_id};
use crate::problem::{ApiError, Problem, or_not_found};

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(approve))
        .routes(routes!(deny))
}

/// A person's decision on a waiting call. Both fields are optional (`{}` is a decision).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    /// Who decides, as the record should name them (a user name, a reviewer's id); recorded
    /// with the tenant whose API key made the request. 1 to 200 characters.
    #[schema(min_length = 1, max_length = 200, example = "alice@example.com")]
    pub by: Option<String>,
    /// Why: recorded, and for a denial part of what the model reads. At most 2,000 characters.
    #[schema(
        max_length = 2000,
        example = "rm -rf is not allowed in this repository"
    )]
    pub reason: Option<String>,
}

fn decision(tenant: &toolexec_core::Tenant, body: ApprovalDecision, approve: bool) -> Decision {
    Decision {
        approve,
        by: json!({"tenant": tenant.name, "name": body.by}),
        reason: body.reason,
        expired: false,
    }
}

/// Approve a call waiting for approval.
///
/// The call runs now, on the session's node, in the session's order from now on (a mutating
/// call waits for the calls running before it), and its end is recorded as for any call. The
/// log shows `approval.decided` (`decision: approved`, `by`: the tenant and the name given,
/// `reason`) then `invocation.started`. The answer is the invocation as it is then (usually
/// `running`); `GET /v1/invocations/{id}?wait=SECONDS` returns it once it has ended. Approving
/// again is harmless (200, the invocation as it is); approving a call that was denied — by a
/// person or because its wait ended — is a 409.
#[utoipa::path(post, path = "/v1/invocations/{id}/approve", tag = "calls", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Invocation id (the `invocation_id` of a `pending_approval` result)")),
    request_body = ApprovalDecision,
    responses(
        (status = 200, description = "Approved (now or before): the invocation as it is now", body = Invocation),
        (status = 404, description = "No such invocation for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Denied before, or never waiting (`already_decided`); or its session is closed (`session_closed`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn approve(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ApprovalDecision>,
) -> Result<Json<Invocation>, ApiError> {
    decide(&state, &tenant, &id, body, true).await
}

/// Deny a call waiting for approval.
///
/// The call never runs: it is recorded `denied`, and the model reads that a person refused it,
/// with the reason given. The log shows `approval.decided` (`decision: denied`, `by`, `reason`)
/// then `invocation.finished`. Denying again is harmless (200); denying a call already approved
/// is a 409 (cancel a running call with `POST /v1/invocations/{id}/cancel`).
#[utoipa::path(post, path = "/v1/invocations/{id}/deny", tag = "calls", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Invocation id (the `invocation_id` of a `pending_approval` result)")),
    request_body = ApprovalDecision,
    responses(
        (status = 200, description = "Denied (now or before): the invocation, `denied`", body = Invocation),
        (status = 404, description = "No such invocation for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Approved before, or never waiting (`already_decided`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn deny(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ApprovalDecision>,
) -> Result<Json<Invocation>, ApiError> {
    decide(&state, &tenant, &id, body, false).await
}

async fn decide(
    state: &SharedState,
    tenant: &toolexec_core::Tenant,
    id: &str,
    body: ApprovalDecision,
    approve: bool,
) -> Result<Json<Invocation>, ApiError> {
    let id = parse_id(id, "invocation")?;
    for (field, text) in [("by", &body.by), ("reason", &body.reason)] {
        if text.as_deref().is_some_and(|t| t.contains('\0')) {
            return Err(ApiError::new(
                toolexec_core::ProblemCode::InvalidRequest,
                format!(
                    "request body at '{field}': a NUL character (\\u0000) cannot be recorded; remove it"
                ),
            ));
        }
    }
    let invocation = state
        .engine
        .decide(tenant.id, id, decision(tenant, body, approve))
        .await
        .map_err(or_not_found("invocation"))?;
    Ok(Json(invocation))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_decision_names_the_tenant_and_the_person() {
        let tenant = toolexec_core::Tenant {
            id: uuid::Uuid::nil(),
            name: "acme".into(),
        };
        let body = super::ApprovalDecision {
            by: Some("alice".into()),
            reason: None,
        };
        let d = super::decision(&tenant, body, true);
        assert_eq!(d.by, serde_json::json!({"tenant": "acme", "name": "alice"}));
        assert!(d.approve && !d.expired);
    }
}
