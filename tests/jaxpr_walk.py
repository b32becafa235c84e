"""Walking a jaxpr with its nested ones (loop bodies, branches, custom rules), for tests that
check what a traced program does."""
import jax


def sub_jaxprs(params):
    """The jaxprs among an equation's parameters."""
    for value in params.values():
        for x in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(x, jax.extend.core.ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jax.extend.core.Jaxpr):
                yield x


def all_eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in it."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in sub_jaxprs(eqn.params):
            yield from all_eqns(sub)
