"""The cell analysis in pure Python with the `ast` module: the oracle the
analysis tests check analysis/ (the C module) against
(test_analysis_differential.py on random sessions, test_analysis_corpus.py
on the corpus), and the baseline `make bench` times it against (issue 3).

The same algorithm as the C module, written the way one would in Python:
ast.parse, a scope-aware walk producing module-level events (LOAD, BIND,
MUTATE, DEL, UNIT, DEFER) and function bodies as groups of global reads, then
a session that replays events to get state/import closures.  IPython magics
are left out (the benchmark cells have none).
"""
import ast
import builtins

BUILTINS = set(dir(builtins)) | {"get_ipython", "display", "exit", "quit", "In", "Out",
                                  "_ih", "_oh", "_dh", "_i", "_ii", "_iii"}
MODULE, FUNC, CLASS, COMP = range(4)
VALUE, IMPORT, FUNCK, CLASSK, STAR = range(5)


class Scope:
    __slots__ = ("kind", "parent", "immediate", "locals", "globals", "nonlocals")

    def __init__(self, kind, parent, immediate):
        self.kind, self.parent, self.immediate = kind, parent, immediate
        self.locals, self.globals, self.nonlocals = set(), set(), set()


def resolves_global(sc, name):
    if sc.kind == MODULE or name in sc.globals:
        return True
    if name in sc.nonlocals or name in sc.locals:
        return False
    sc = sc.parent
    while sc is not None:
        if sc.kind == MODULE:
            return True
        if sc.kind != CLASS:
            if name in sc.globals:
                return True
            if name in sc.locals or name in sc.nonlocals:
                return False
        sc = sc.parent
    return True


def scan(node, sc, comp=False):
    """Names a scope binds (symtable's first pass)."""
    if isinstance(node, ast.Name):
        if not comp and not isinstance(node.ctx, ast.Load):
            sc.locals.add(node.id)
    elif isinstance(node, ast.NamedExpr):
        sc.locals.add(node.target.id)
        scan(node.value, sc, comp)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if not comp:
            sc.locals.add(node.name)
    elif isinstance(node, ast.Lambda):
        pass
    elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        for child in ast.iter_child_nodes(node):
            scan(child, sc, True)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        if not comp:
            for a in node.names:
                if a.name != "*":
                    sc.locals.add(a.asname or a.name.split(".")[0])
    elif isinstance(node, ast.Global):
        sc.globals.update(node.names)
    elif isinstance(node, ast.Nonlocal):
        sc.nonlocals.update(node.names)
    else:
        if not comp and isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) \
                and node.name:
            sc.locals.add(node.name)
        if not comp and isinstance(node, ast.MatchMapping) and node.rest:
            sc.locals.add(node.rest)
        for child in ast.iter_child_nodes(node):
            scan(child, sc, comp)


class Cell:
    def __init__(self, src):
        self.events, self.groups, self.imports = [], [], []
        self.block_parent = [-1]
        self.opaque = False
        self.error = None
        first = src.lstrip("\r\n")
        indent = first[:len(first) - len(first.lstrip(" \t"))]
        if indent:  # IPython's leading_indent
            src = "".join(line[len(indent):] if line.startswith(indent) else line
                          for line in src.splitlines(True))
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            self.error = f"{type(e).__name__}: {e}"
            return
        self.scope = Scope(MODULE, None, True)
        self.group = self.class_group = -1
        self.defset, self.defblock = None, 0
        self.loopdefs = None
        self.cond = self.block = 0
        self.body(tree.body)
        self.reads = Replay(None, self).run().reads

    # -- events
    def emit(self, typ, name=None, kind=0, ref=-1):
        self.events.append((typ, name, kind, self.cond > 0, self.block, ref))

    def enter(self):
        saved = self.block
        self.cond += 1
        self.block_parent.append(saved)
        self.block = len(self.block_parent) - 1
        return saved

    def leave(self, saved):
        self.cond -= 1
        self.block = saved

    def encloses(self, outer, inner):
        if outer < 0 or inner < 0:
            return False
        while inner >= 0:
            if inner == outer:
                return True
            inner = self.block_parent[inner]
        return False

    def new_group(self, name, kind):
        self.groups.append({"name": name, "kind": kind, "globals": set(),
                            "gwrites": set(), "paths": set(), "opaque": False})
        return len(self.groups) - 1

    def mark_opaque(self):
        if self.scope.immediate:
            self.opaque = True
        if self.group >= 0:
            self.groups[self.group]["opaque"] = True

    def load(self, name):
        if not resolves_global(self.scope, name):
            return
        if name in ("get_ipython", "__main__"):
            self.mark_opaque()
        if self.scope.immediate:
            self.emit("LOAD", name)
        if self.group >= 0:
            self.groups[self.group]["globals"].add(name)

    def store_in(self, sc, name, kind=VALUE, ref=-1):
        if sc.kind == MODULE:
            self.emit("BIND", name, kind, ref)
            if self.defset is not None and self.block == self.defblock and sc is self.scope:
                self.defset.add(name)
            if self.loopdefs is not None and kind in (FUNCK, CLASSK) and name not in self.loopdefs:
                self.loopdefs.append(name)
        elif name in sc.globals:
            if sc.immediate:
                self.emit("BIND", name, VALUE)
            if self.group >= 0:
                self.groups[self.group]["gwrites"].add(name)

    def store(self, name, kind=VALUE, ref=-1):
        self.store_in(self.scope, name, kind, ref)

    def mutate(self, node):
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        if isinstance(node, ast.Name) and self.scope.kind == MODULE:
            self.emit("MUTATE", node.id)

    # -- walk
    def body(self, stmts, cond=False):
        saved = self.enter() if cond else None
        for s in stmts:
            if self.scope.kind == MODULE:
                self.emit("UNIT")
            self.visit(s)
        if cond:
            self.leave(saved)

    def visit_list(self, nodes):
        for n in nodes:
            if n is not None:
                self.visit(n)

    def generic(self, node):
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def visit(self, node):
        method = getattr(self, "v_" + type(node).__name__, None)
        if method:
            method(node)
        else:
            self.generic(node)

    def v_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.load(node.id)
        elif isinstance(node.ctx, ast.Store):
            self.store(node.id)
        elif self.scope.kind == MODULE:
            self.emit("LOAD", node.id)
            self.emit("DEL", node.id)
            if self.defset is not None:
                self.defset.discard(node.id)

    def v_Call(self, node):
        f = node.func
        if isinstance(f, ast.Name) and resolves_global(self.scope, f.id):
            if f.id in ("exec", "eval", "globals", "locals", "execfile") or \
                    (f.id in ("vars", "dir") and not node.args and not node.keywords):
                self.mark_opaque()
        self.generic(node)
        if self.scope.immediate and self.group < 0 and self.class_group < 0:
            any_arg = False
            for a in list(node.args) + [k.value for k in node.keywords]:
                if isinstance(a, ast.Starred):
                    a = a.value
                if isinstance(a, ast.Name):
                    self.emit("ARG", a.id, 0)
                    any_arg = True
                elif isinstance(a, ast.Lambda):
                    self.emit("ARG", None, 1)
                    any_arg = True
            if any_arg:
                if isinstance(f, ast.Name):
                    self.emit("PASS", f.id, 0)
                elif isinstance(f, ast.Attribute):
                    base = f.value
                    while isinstance(base, (ast.Attribute, ast.Subscript, ast.Call)):
                        base = base.func if isinstance(base, ast.Call) else base.value
                    if isinstance(base, ast.Name) and base.id != "get_ipython":
                        self.emit("PASS", base.id, 1)

    def v_Attribute(self, node):
        self.generic(node)
        if not isinstance(node.ctx, ast.Load):
            self.mutate(node)

    v_Subscript = v_Attribute

    def params(self, args, sc):
        for a in args.posonlyargs + args.args + args.kwonlyargs:
            sc.locals.add(a.arg)
        for a in (args.vararg, args.kwarg):
            if a:
                sc.locals.add(a.arg)

    def v_FunctionDef(self, node):
        self.visit_list(node.decorator_list)
        self.generic(node.args)
        if node.returns:
            self.visit(node.returns)
        own = self.group < 0 and self.class_group < 0
        g = self.group if self.group >= 0 else \
            self.class_group if self.class_group >= 0 else self.new_group(node.name, FUNCK)
        sc = Scope(FUNC, self.scope, False)
        self.params(node.args, sc)
        for s in node.body:
            scan(s, sc)
        saved = self.scope, self.group
        self.scope, self.group = sc, g
        self.body(node.body)
        self.scope, self.group = saved
        self.store(node.name, FUNCK, g if own else -1)
        self.decorated(node)

    def decorated(self, node):
        if self.scope.kind == MODULE and node.decorator_list:
            for d in node.decorator_list:
                if not isinstance(d, ast.Name):
                    self.mutate(d)
            self.emit("LOAD", node.name)

    v_AsyncFunctionDef = v_FunctionDef

    def v_ClassDef(self, node):
        self.visit_list(node.decorator_list)
        self.visit_list(node.bases)
        self.visit_list(node.keywords)
        own = self.group < 0 and self.class_group < 0
        cg = self.new_group(node.name, CLASSK) if own else -1
        saved_cg = self.class_group
        if own:
            self.class_group = cg
        sc = Scope(CLASS, self.scope, self.scope.immediate and self.group < 0)
        for s in node.body:
            scan(s, sc)
        saved = self.scope
        self.scope = sc
        self.body(node.body)
        self.scope, self.class_group = saved, saved_cg
        self.store(node.name, CLASSK, cg)
        self.decorated(node)

    def v_Lambda(self, node):
        self.generic(node.args)
        own = self.group < 0 and self.class_group < 0
        g = self.group if self.group >= 0 else \
            self.class_group if self.class_group >= 0 else self.new_group(None, VALUE)
        sc = Scope(FUNC, self.scope, self.scope.immediate)
        self.params(node.args, sc)
        scan(node.body, sc)
        saved = self.scope, self.group
        self.scope, self.group = sc, g
        self.visit(node.body)
        self.scope, self.group = saved
        if own:
            self.emit("DEFER", ref=g)

    def v_ListComp(self, node):
        gens = node.generators
        self.visit(gens[0].iter)
        lazy = isinstance(node, ast.GeneratorExp) and self.group < 0 and self.class_group < 0
        saved_group = self.group
        g = self.new_group(None, VALUE) if lazy else -1
        if lazy:
            self.group = g
        sc = Scope(COMP, self.scope, self.scope.immediate)
        for gen in gens:
            scan(gen.target, sc)
        saved = self.scope
        self.scope = sc
        blk = self.enter()
        for i, gen in enumerate(gens):
            if i:
                self.visit(gen.iter)
            self.visit(gen.target)
            self.visit_list(gen.ifs)
        if isinstance(node, ast.DictComp):
            self.visit(node.key)
            self.visit(node.value)
        else:
            self.visit(node.elt)
        self.leave(blk)
        self.scope = saved
        self.group = saved_group
        if lazy:
            self.emit("DEFER", ref=g)

    v_SetComp = v_GeneratorExp = v_DictComp = v_ListComp

    def v_NamedExpr(self, node):
        self.visit(node.value)
        sc = self.scope
        while sc.kind == COMP and sc.parent:
            sc = sc.parent
        self.store_in(sc, node.target.id)

    def v_Assign(self, node):
        self.visit(node.value)
        self.visit_list(node.targets)

    def v_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            self.load(node.target.id)
            self.visit(node.value)
            self.store(node.target.id)
            if self.scope.kind == MODULE:
                self.emit("MUTATE", node.target.id)
        else:
            self.visit(node.target)
            self.visit(node.value)

    def v_AnnAssign(self, node):
        self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)
        if node.value is not None or not isinstance(node.target, ast.Name):
            self.visit(node.target)

    def loop(self, node, is_while):
        self.visit(node.test if is_while else node.iter)
        saved_defs, self.loopdefs = self.loopdefs, []
        saved = self.enter()
        if not is_while:
            self.visit(node.target)
        self.body(node.body)
        defs = self.loopdefs
        if defs and self.scope.kind == MODULE:
            self.emit("UNIT")
            for name in defs:
                self.emit("LOAD", name)
        self.leave(saved)
        self.loopdefs = saved_defs
        if saved_defs is not None:
            saved_defs.extend(n for n in defs if n not in saved_defs)
        self.body(node.orelse, True)

    def v_For(self, node):
        self.loop(node, False)

    v_AsyncFor = v_For

    def v_While(self, node):
        self.loop(node, True)

    def branch(self, stmts, parent=None):
        outer = self.block
        if parent is not None:
            self.block = parent
        saved = self.enter()
        self.last_branch = self.block
        saved_set, saved_block = self.defset, self.defblock
        self.defset, self.defblock = set(), self.block
        self.body(stmts)
        got = self.defset
        self.defset, self.defblock = saved_set, saved_block
        self.leave(saved)
        self.block = outer
        return got

    def v_If(self, node):
        self.visit(node.test)
        then = self.branch(node.body)
        other = self.branch(node.orelse)
        if node.orelse and self.scope.kind == MODULE:
            for name in [n for n in then if n in other]:
                self.emit("SETTLE", name)
                if self.defset is not None and self.block == self.defblock:
                    self.defset.add(name)

    def v_With(self, node):
        self.visit_list(node.items)
        self.body(node.body)

    v_AsyncWith = v_With

    def v_Try(self, node):
        ok = self.branch(node.body)
        body_block = self.last_branch
        common = None
        for h in node.handlers:
            saved = self.enter()
            saved_set, saved_block = self.defset, self.defblock
            self.defset, self.defblock = set(), self.block
            if self.scope.kind == MODULE:
                self.emit("UNIT")
            if h.type:
                self.visit(h.type)
            if h.name:
                self.store(h.name)
            self.body(h.body)
            if h.name and self.scope.kind == MODULE:
                self.emit("DEL", h.name)
                self.defset.discard(h.name)
            mine = self.defset
            self.defset, self.defblock = saved_set, saved_block
            self.leave(saved)
            common = set(mine) if common is None else common & mine
        ok |= self.branch(node.orelse, parent=body_block)
        self.body(node.finalbody)
        if node.handlers and self.scope.kind == MODULE:
            for name in [n for n in ok if n in common]:
                self.emit("SETTLE", name)
                if self.defset is not None and self.block == self.defblock:
                    self.defset.add(name)

    v_TryStar = v_Try

    def v_Match(self, node):
        self.visit(node.subject)
        for c in node.cases:
            saved = self.enter()
            self.visit(c.pattern)
            if c.guard:
                self.visit(c.guard)
            self.body(c.body)
            self.leave(saved)

    def v_MatchAs(self, node):
        self.generic(node)
        if node.name:
            self.store(node.name)

    v_MatchStar = v_MatchAs

    def v_MatchMapping(self, node):
        self.generic(node)
        if node.rest:
            self.store(node.rest)

    def v_Import(self, node):
        for a in node.names:
            if isinstance(node, ast.Import):
                mod = a.name
                bound = a.asname or a.name.split(".")[0]
                path = mod
                stmt = f"import {mod} as {a.asname}" if a.asname else f"import {mod}"
                kind = IMPORT
            else:
                mod = "." * node.level + (node.module or "")
                if a.name == "*":
                    bound, path, stmt, kind = "*" + mod, mod, f"from {mod} import *", STAR
                    self.mark_opaque()
                else:
                    bound = a.asname or a.name
                    path = f"{mod}.{a.name}"
                    stmt = f"from {mod} import {a.name}" + (f" as {a.asname}" if a.asname else "")
                    kind = IMPORT
            if (mod if isinstance(node, ast.ImportFrom) else a.name) == "__main__":
                self.mark_opaque()
            if self.group >= 0:
                self.groups[self.group]["paths"].add(path)
            ref = -1
            if self.scope.kind == MODULE or bound in self.scope.globals:
                self.imports.append({"module": mod, "path": path, "stmt": stmt})
                ref = len(self.imports) - 1
            self.store(bound, kind, ref)

    v_ImportFrom = v_Import

    def v_Global(self, node):
        pass

    v_Nonlocal = v_Global

    def v_Expr(self, node):
        self.visit(node.value)
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
            self.mutate(node.value.func.value)


def package(path):
    if not path or path.startswith("."):
        return None
    top = path.split(".")[0]
    return None if top == "__future__" else top


class Binding:
    __slots__ = ("kind", "prov", "deps", "gwrites", "opaque", "path", "stmt")

    def __init__(self, kind):
        self.kind, self.prov, self.deps, self.gwrites = kind, set(), set(), set()
        self.opaque, self.path, self.stmt = False, None, None


class Replay:
    """Replays a cell's events against a session (None: an empty one)."""

    def __init__(self, session, cell, record=False):
        self.s, self.cell, self.record = session, cell, record
        self.overlay = {}  # name -> [alts [(binding, block)], base, deleted]
        self.reads, self.state, self.stmts, self.paths = set(), set(), set(), set()
        self.opaque = cell.opaque
        self.uprov, self.udeps, self.umut, self.ubinds = set(), set(), set(), []
        self.visited, self.pending = set(), set()
        self.mutated, self.pargs, self.plambda = set(), [], False

    def base(self, name):
        return self.s.names.get(name) if self.s else None

    def visit(self, name, b, in_cell, cellside, block, stack):
        if b.kind in (IMPORT, STAR):
            self.paths.add(b.path)
            self.uprov.add(b.path)
            if not in_cell:
                self.stmts.add(b.stmt)
            return
        if not in_cell:
            self.state.add(name)
        if id(b) in self.visited:
            return
        self.visited.add(id(b))
        self.paths |= b.prov
        self.uprov |= b.prov
        self.udeps |= b.deps
        self.opaque |= b.opaque
        for d in b.deps:
            stack.append((d, cellside and in_cell, block))
        self.pending |= b.gwrites

    def load(self, name, block):
        stack = [(name, True, block)]
        while stack:
            name, cellside, block = stack.pop()
            e = self.overlay.get(name)
            if e:
                hidden = not e[1]
                for b, blk in reversed(e[0]):
                    self.visit(name, b, True, cellside, block, stack)
                    if self.cell.encloses(blk, block):
                        hidden = True
                        break
                if hidden:
                    continue
            b = self.base(name)
            builtin = b is None and name in BUILTINS
            if cellside and not builtin:
                self.reads.add(name)
            if b is not None:
                self.visit(name, b, False, False, block, stack)
            elif not builtin and self.s:
                for key in self.s.stars:
                    self.visit(name, self.s.names[key], False, False, block, stack)
        for g in self.pending:
            self.put(g, Binding(VALUE), True, -1)
        self.pending = set()

    def put(self, name, b, cond, block):
        e = self.overlay.setdefault(name, [[], True, False])
        if not cond:
            e[0], e[1] = [], False
        e[2] = False
        e[0].append((b, block))
        self.ubinds.append(b)

    def end_unit(self):
        for b in self.ubinds:
            if b.kind not in (IMPORT, STAR):
                b.prov |= self.uprov
                b.deps |= self.udeps
        for name in self.umut:
            e = self.overlay.get(name)
            targets = [b for b, _ in (e[0] if e else [])]
            if self.record and (not e or e[1]) and self.base(name) is not None:
                targets.append(self.base(name))
            for b in targets:
                if b.kind not in (IMPORT, STAR):
                    b.prov |= self.uprov
                    b.deps |= self.udeps
        self.uprov, self.udeps, self.umut, self.ubinds = set(), set(), set(), []
        self.visited = set()

    def current(self, name):
        e = self.overlay.get(name)
        out = [b for b, _ in e[0]] if e else []
        if (not e or e[1]) and self.base(name) is not None:
            out.append(self.base(name))
        return out

    def pass_call(self, name, kind):
        code = self.plambda or any(b.kind in (FUNCK, CLASSK)
                                   for a in self.pargs for b in self.current(a))
        self.pargs, self.plambda = [], False
        if not code:
            return
        if kind == 1:
            self.umut.add(name)
            return
        for callee in self.current(name):
            if callee.kind in (FUNCK, CLASSK):
                for d in callee.deps:
                    if any(b.kind not in (IMPORT, STAR, FUNCK, CLASSK) for b in self.current(d)):
                        self.umut.add(d)

    def run(self):
        cell = self.cell
        for typ, name, kind, cond, block, ref in cell.events:
            if typ == "UNIT":
                self.end_unit()
                self.pargs, self.plambda = [], False
            elif typ == "ARG":
                if kind == 1:
                    self.plambda = True
                else:
                    self.pargs.append(name)
            elif typ == "PASS":
                self.pass_call(name, kind)
            elif typ == "SETTLE":
                e = self.overlay.setdefault(name, [[], True, False])
                if e[0]:
                    e[1] = False
            elif typ == "LOAD":
                self.load(name, block)
            elif typ == "BIND":
                b = Binding(kind)
                if kind in (FUNCK, CLASSK) and ref >= 0:
                    g = cell.groups[ref]
                    b.deps |= g["globals"]
                    b.gwrites |= g["gwrites"]
                    b.prov |= g["paths"]
                    b.opaque = g["opaque"]
                elif kind in (IMPORT, STAR):
                    b.path, b.stmt = cell.imports[ref]["path"], cell.imports[ref]["stmt"]
                self.put(name, b, cond, block)
            elif typ == "MUTATE":
                self.umut.add(name)
            elif typ == "DEL":
                e = self.overlay.setdefault(name, [[], True, False])
                if not cond:
                    e[0], e[1], e[2] = [], False, True
                else:
                    e[0] = [(b, blk) for b, blk in e[0] if blk != block]
            elif typ == "DEFER":
                g = cell.groups[ref]
                self.udeps |= g["globals"]
                self.uprov |= g["paths"]
                self.opaque |= g["opaque"]
        self.end_unit()
        return self


class Session:
    def __init__(self):
        self.names, self.stars = {}, set()

    def record(self, cell):
        if cell.error:
            return
        r = Replay(self, cell, record=True).run()
        for name, (alts, base, deleted) in r.overlay.items():
            if deleted:
                self.names.pop(name, None)
                self.stars.discard(name)
            elif alts:
                old = self.names.get(name) if base else None
                if len(alts) == 1 and old is None:
                    nb = alts[0][0]
                else:
                    every = [a for a, _ in alts] + ([old] if old else [])
                    first = every[0]
                    same_import = all(b.kind in (IMPORT, STAR) and b.kind == first.kind and
                                      b.path is not None and b.path == first.path for b in every)
                    nb = Binding(first.kind if same_import else VALUE)
                    if same_import:
                        nb.path, nb.stmt = first.path, first.stmt
                    for b in every:
                        nb.prov |= b.prov | ({b.path} if b.path else set())
                        nb.deps |= b.deps
                        nb.gwrites |= b.gwrites
                        nb.opaque |= b.opaque
                self.names[name] = nb
                if nb.kind == STAR:
                    self.stars.add(name)

    def closure(self, cell):
        r = Replay(self, cell).run()
        state, stmts, paths = set(r.state), set(r.stmts), set(r.paths)
        if r.opaque:
            for name, b in self.names.items():
                if b.kind in (IMPORT, STAR):
                    stmts.add(b.stmt)
                    paths.add(b.path)
                else:
                    state.add(name)
                    paths |= b.prov
        imports = {package(p) for p in paths} | {package(i["module"]) for i in cell.imports}
        imports.discard(None)
        return {"state": sorted(state), "imports": sorted(imports),
                "stmts": sorted(stmts), "opaque": r.opaque}
