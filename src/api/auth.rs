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
}

impl Permission {
    fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Write => "write",
            Permission::Approve => "approve",
        }
    }
}

/// Whether `caller` may do what needs `permission`; a refusal is a 403 naming both.
pub fn permit(caller: &Caller, permission: Permission) -> Result<(), ApiError> {
    let allowed = match (caller.role, permission) {
        (Role::Admin, _) => true,
        (Role::Approver, Permission::Read | Permission::Approve) => true,
        (Role::ReadOnly, Permission::Read) => true,
        (Role::Approver, Permission::Write) | (Role::ReadOnly, _) => false,
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
