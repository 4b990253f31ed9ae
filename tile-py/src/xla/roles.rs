//! Which of XLA's buffers or scalar attributes each kernel parameter takes: a call site's role
//! list, checked once when the kernel is registered ([`Roles`]) and read by the handler without
//! the interpreter.
//!
//! A `tile_py.Kernel`'s roles follow from its declared intents (`In` the next operand, `Out` the
//! next result, `InOut` the next operand and the result XLA aliases to it, a scalar the next
//! scalar attribute). A cuTile kernel declares every array `In` (tile cannot tell which it
//! writes), so `tile_py.jax.cutile_call` passes the roles of its call site explicitly.

use tile_launch::{Intent, Param, Scalar};

use super::frame::{Buffer, FfiError};
use super::handler::MAX_SCALARS;

/// What one kernel parameter takes from a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Operand `j` of the custom call (an input XLA owns and the kernel only reads).
    Operand(usize),
    /// Result `k` (a buffer XLA allocates for the kernel to write).
    Result(usize),
    /// Operand `j` and result `k`, which XLA aliases (one buffer, updated in place).
    Aliased {
        /// The operand's index.
        operand: usize,
        /// The result's index.
        result: usize,
    },
    /// Scalar attribute `s` (`scalar{s}`, `scalar{s}_kind`).
    Scalar(usize),
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Role::Operand(j) => write!(f, "operand {j}"),
            Role::Result(k) => write!(f, "result {k}"),
            Role::Aliased { operand, result } => {
                write!(f, "operand {operand} updated in place as result {result}")
            }
            Role::Scalar(s) => write!(f, "scalar attribute {s}"),
        }
    }
}

impl Role {
    /// The role as `tile_py.jax` spells it: `("operand", j)`, `("result", k)`,
    /// `("inout", j, k)`, `("scalar", s)`.
    pub(crate) fn to_tuple(self) -> (&'static str, usize, Option<usize>) {
        match self {
            Role::Operand(j) => ("operand", j, None),
            Role::Result(k) => ("result", k, None),
            Role::Aliased { operand, result } => ("inout", operand, Some(result)),
            Role::Scalar(s) => ("scalar", s, None),
        }
    }
}

/// A role list checked against a kernel's parameters: one role per parameter, buffers for
/// tensor and array parameters and scalar attributes for scalar parameters, a parameter that
/// writes (`Out`, `InOut`) given a result, every operand and every result taken by exactly one
/// parameter, and scalar attributes numbered in declaration order (as `_xla_scalars` converts
/// them). Made only by [`Roles::new`] and [`Roles::from_intents`]; the handler trusts it and
/// checks only XLA's counts against it.
#[derive(Clone, Debug)]
pub(crate) struct Roles {
    roles: Vec<Role>,
    operands: usize,
    results: usize,
    scalars: usize,
}

/// What a parameter is bound to for one call: one of XLA's buffers, or a scalar value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Binding<'a> {
    /// A buffer, for the parameter of this index.
    Buffer(Buffer<'a>, usize),
    /// A scalar value.
    Scalar(Scalar),
}

impl Roles {
    /// The roles a `tile_py.Kernel`'s declared intents give: `In` the next operand, `Out` the
    /// next result, `InOut` the next operand aliased to the next result, a scalar the next
    /// scalar attribute.
    ///
    /// # Errors
    ///
    /// A parameter kind that cannot be passed from JAX (its index and kind in the message).
    pub(crate) fn from_intents(params: &[Param]) -> Result<Roles, String> {
        let (mut j, mut k, mut s) = (0usize, 0usize, 0usize);
        let mut roles = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let role = match p {
                Param::Scalar(_) => {
                    s += 1;
                    Role::Scalar(s - 1)
                }
                Param::Tensor { intent, .. } | Param::Array { intent, .. } => match intent {
                    Intent::Read => {
                        j += 1;
                        Role::Operand(j - 1)
                    }
                    Intent::Write => {
                        k += 1;
                        Role::Result(k - 1)
                    }
                    Intent::ReadWrite => {
                        j += 1;
                        k += 1;
                        Role::Aliased {
                            operand: j - 1,
                            result: k - 1,
                        }
                    }
                },
                other => return Err(format!("parameter {i} ({other}) cannot be passed from JAX")),
            };
            roles.push(role);
        }
        Ok(Roles {
            roles,
            operands: j,
            results: k,
            scalars: s,
        })
    }

    /// Checks `roles` (one per parameter of `params`, in order) as the type's docs say.
    ///
    /// # Errors
    ///
    /// The first rule broken, naming the parameter.
    pub(crate) fn new(params: &[Param], roles: Vec<Role>) -> Result<Roles, String> {
        if roles.len() != params.len() {
            return Err(format!(
                "{} roles for {} parameters (one role per parameter)",
                roles.len(),
                params.len()
            ));
        }
        let mut operands: Vec<usize> = Vec::new();
        let mut results: Vec<usize> = Vec::new();
        let mut scalars = 0usize;
        // Operand and result indices are dense from 0, so each is below the parameter count;
        // a larger one is refused before anything is allocated for it.
        let limit = params.len();
        let mut too_big = None;
        let mut count = |list: &mut Vec<usize>, at: usize| {
            if at >= limit {
                too_big.get_or_insert(at);
                return;
            }
            if list.len() <= at {
                list.resize(at + 1, 0);
            }
            list[at] += 1;
        };
        for (i, (p, r)) in params.iter().zip(&roles).enumerate() {
            match (p, *r) {
                (Param::Scalar(_), Role::Scalar(s)) => {
                    if s != scalars {
                        return Err(format!(
                            "parameter {i} takes scalar attribute {s}, but scalar attributes \
                             are numbered in declaration order (this is scalar {scalars})"
                        ));
                    }
                    scalars += 1;
                }
                (Param::Scalar(_), r) => {
                    return Err(format!(
                        "parameter {i} ({p}) is a scalar, its role ({r}) is not"
                    ));
                }
                (Param::Tensor { intent, .. } | Param::Array { intent, .. }, r) => match r {
                    Role::Scalar(_) => {
                        return Err(format!(
                            "parameter {i} ({p}) takes a buffer, its role ({r}) is a scalar"
                        ));
                    }
                    Role::Operand(j) => {
                        if intent.writes() {
                            return Err(format!(
                                "parameter {i} ({p}) writes, and an operand is XLA's to keep: \
                                 give it a result or an aliased operand"
                            ));
                        }
                        count(&mut operands, j);
                    }
                    Role::Result(k) => count(&mut results, k),
                    Role::Aliased { operand, result } => {
                        count(&mut operands, operand);
                        count(&mut results, result);
                    }
                },
                (other, _) => {
                    return Err(format!("parameter {i} ({other}) cannot be passed from JAX"));
                }
            }
        }
        if let Some(at) = too_big {
            return Err(format!(
                "buffer index {at} for a kernel of {limit} parameters (operands and results are \
                 numbered from 0)"
            ));
        }
        if scalars > MAX_SCALARS {
            return Err(format!(
                "{scalars} scalar parameters (a call passes at most {MAX_SCALARS})"
            ));
        }
        for (what, list) in [("operand", &operands), ("result", &results)] {
            if let Some((at, n)) = list.iter().enumerate().find(|&(_, &n)| n != 1) {
                return Err(if *n == 0 {
                    format!("no parameter takes {what} {at} (they must be numbered from 0)")
                } else {
                    format!("{what} {at} is taken by {n} parameters, one may take it")
                });
            }
        }
        Ok(Roles {
            roles,
            operands: operands.len(),
            results: results.len(),
            scalars,
        })
    }

    /// The roles, one per parameter.
    pub(crate) fn roles(&self) -> &[Role] {
        &self.roles
    }

    /// `(operands, results, scalars)`: how many of each a call passes.
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        (self.operands, self.results, self.scalars)
    }

    /// The kernel's arguments of one call, in parameter order: XLA's buffers by role, and the
    /// scalars by `scalar(s)`.
    ///
    /// # Errors
    ///
    /// XLA passing another number of operands, results or scalars than the roles take, an
    /// aliased operand that is not its result's buffer, or `scalar`'s error.
    pub(crate) fn bind<'a>(
        &self,
        name: &str,
        args: &[Buffer<'a>],
        rets: &[Buffer<'a>],
        scalars: usize,
        scalar: impl Fn(usize) -> Result<Scalar, FfiError>,
    ) -> Result<Vec<Binding<'a>>, FfiError> {
        if args.len() != self.operands || rets.len() != self.results || scalars != self.scalars {
            return Err(FfiError::invalid(format!(
                "tile_py.jax: kernel `{name}` takes {} operands, {} results and {} scalars; \
                 XLA passed {}, {} and {scalars}",
                self.operands,
                self.results,
                self.scalars,
                args.len(),
                rets.len()
            )));
        }
        // The counts match and every index is below its count (checked when made).
        let mut out = Vec::with_capacity(self.roles.len());
        for (index, r) in self.roles.iter().enumerate() {
            out.push(match *r {
                Role::Operand(j) => Binding::Buffer(args[j], index),
                Role::Result(k) => Binding::Buffer(rets[k], index),
                Role::Aliased { operand, result } => {
                    let (a, b) = (args[operand], rets[result]);
                    if a.data != b.data {
                        return Err(FfiError::invalid(format!(
                            "tile_py.jax: kernel `{name}`: argument {index} (operand {operand} \
                             updated in place as result {result}): XLA did not alias the \
                             operand to its result"
                        )));
                    }
                    Binding::Buffer(b, index)
                }
                Role::Scalar(s) => Binding::Scalar(scalar(s)?),
            });
        }
        Ok(out)
    }
}
