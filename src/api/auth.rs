//! Who is calling and what they may do. Authentication turns a bearer token into a
//! [`Caller`]; every permission decision goes through [`permit`], the one hook the
//! read-only and approver tokens plug into.

use axum::http::StatusCode;

use super::ApiError;

/// What a token allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Read, and approve or reject gates.
    Approver,
    /// Read only.
    ReadOnly,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Approver => "approver",
            Role::ReadOnly => "read_only",
        }
    }
}

/// The authenticated identity of a request, recorded with what it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// A stable name for logs and records (`admin`, or a configured token's name).
    pub name: String,
    pub role: Role,
}

/// What an endpoint needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    Read,
    /// Submit, cancel, dead-letter actions.
    Write,
    /// Approve or reject a gate.
    Approve,
    /// Take a backup of the whole state (admin only).
    Admin,
}

impl Permission {
    fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Write => "write",
            Permission::Approve => "approve",
            Permission::Admin => "administer",
        }
    }
}

/// Who presents `token`: the admin token, or one of the configured tokens (compared by
/// SHA-256). Every comparison takes constant time, and every configured token is compared,
/// so the time says nothing about which one (if any) matched.
pub fn identify(token: &str, admin: &str, tokens: &[crate::config::Token]) -> Option<Caller> {
    use subtle::ConstantTimeEq;
    if bool::from(token.as_bytes().ct_eq(admin.as_bytes())) {
        return Some(Caller {
            name: "admin".to_string(),
            role: Role::Admin,
        });
    }
    let digest = crate::config::digest_of(token);
    let mut found = None;
    for configured in tokens {
        if bool::from(digest.ct_eq(&configured.digest)) {
            found = Some(Caller {
                name: configured.name.clone(),
                role: match configured.role {
                    crate::config::TokenRole::ReadOnly => Role::ReadOnly,
                    crate::config::TokenRole::Approver => Role::Approver,
                },
            });
        }
    }
    found
}

/// What a `/v1` request needs: deciding a gate needs `Approve`, a backup `Admin`, any
/// other read `Read`, any other change `Write`.
pub fn needed(method: &axum::http::Method, path: &str) -> Permission {
    if path.contains("/gates/") && *method == axum::http::Method::POST {
        Permission::Approve
    } else if path.ends_with("/backup") {
        Permission::Admin
    } else if *method == axum::http::Method::GET || *method == axum::http::Method::HEAD {
        Permission::Read
    } else {
        Permission::Write
    }
}

/// Whether `caller` may do what needs `permission`; a refusal is a 403 naming both.
pub fn permit(caller: &Caller, permission: Permission) -> Result<(), ApiError> {
    let allowed = match (caller.role, permission) {
        (Role::Admin, _) => true,
        (Role::Approver, Permission::Read | Permission::Approve) => true,
        (Role::ReadOnly, Permission::Read) => true,
        (Role::Approver, Permission::Write | Permission::Admin) | (Role::ReadOnly, _) => false,
    };
    if allowed {
        return Ok(());
    }
    tracing::warn!(
        caller = %caller.name,
        role = caller.role.as_str(),
        permission = permission.as_str(),
        "permission denied"
    );
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        format!(
            "a {} token may not {}",
            caller.role.as_str(),
            permission.as_str()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_exactly_their_permissions() {
        let caller = |role| Caller {
            name: "t".into(),
            role,
        };
        let table = [
            (Role::Admin, Permission::Read, true),
            (Role::Admin, Permission::Write, true),
            (Role::Admin, Permission::Approve, true),
            (Role::Admin, Permission::Admin, true),
            (Role::Approver, Permission::Admin, false),
            (Role::ReadOnly, Permission::Admin, false),
            (Role::Approver, Permission::Read, true),
            (Role::Approver, Permission::Write, false),
            (Role::Approver, Permission::Approve, true),
            (Role::ReadOnly, Permission::Read, true),
            (Role::ReadOnly, Permission::Write, false),
            (Role::ReadOnly, Permission::Approve, false),
        ];
        for (role, permission, allowed) in table {
            assert_eq!(
                permit(&caller(role), permission).is_ok(),
                allowed,
                "{role:?} {permission:?}"
            );
        }
    }
}
