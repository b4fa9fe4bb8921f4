/* tests/test_schema.c - the schema parser (runtime/schema.c). */
#include "runtime/runtime.h"
#include "t.h"

static void parses_pytorch_signatures(void)
{
    schema s;
    char err[256];
    CHECK(schema_parse("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor", &s,
                       err, sizeof err) == OPJIT_OK);
    CHECK(!strcmp(s.name, "nms"));
    CHECK(s.nargs == 3 && s.nouts == 1);
    CHECK(s.args[0].kind == OPJIT_KIND_TENSOR && !s.args[0].optional);
    CHECK(s.args[2].kind == OPJIT_KIND_FLOAT && !strcmp(s.args[2].name, "iou_threshold"));
    schema_free(&s);

    CHECK(schema_parse("conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] "
                       "stride=1, int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor",
                       &s, err, sizeof err) == OPJIT_OK);
    CHECK(s.nargs == 7);
    CHECK(s.args[2].optional && s.args[2].has_default && s.args[2].def.kind == OPJIT_KIND_NONE);
    CHECK(s.args[3].kind == OPJIT_KIND_INTS && s.args[3].list_len == 2);
    CHECK(s.args[3].def.kind == OPJIT_KIND_INTS && s.args[3].def.len == 2);
    CHECK(s.args[3].def.u.ints[0] == 1 && s.args[3].def.u.ints[1] == 1);
    CHECK(s.args[6].def.kind == OPJIT_KIND_INT && s.args[6].def.u.i == 1);
    CHECK(!strcmp(s.args[3].default_text, "1"));
    schema_free(&s);
}

static void defaults_of_every_type(void)
{
    schema s;
    char err[256];
    CHECK(schema_parse("f(Tensor x, bool flag=True, float eps=1e-5, int n=-3, int[3] k=[1, 2, 3], "
                       "float? scale=None) -> (Tensor out, Tensor idx)",
                       &s, err, sizeof err) == OPJIT_OK);
    CHECK(s.nouts == 2);
    CHECK(s.args[1].def.kind == OPJIT_KIND_BOOL && s.args[1].def.u.b == 1);
    CHECK(s.args[2].def.u.f == 1e-5);
    CHECK(s.args[3].def.u.i == -3);
    CHECK(s.args[4].def.u.ints[0] == 1 && s.args[4].def.u.ints[2] == 3);
    CHECK(s.args[5].optional && s.args[5].def.kind == OPJIT_KIND_NONE);
    schema_free(&s);
    CHECK(schema_parse("g(Tensor a, *, bool inplace=false) -> Tensor", &s, err, sizeof err) == 0);
    CHECK(s.nargs == 2 && s.args[1].def.u.b == 0);
    schema_free(&s);
    CHECK(schema_parse("h() -> Tensor", &s, err, sizeof err) == 0 && s.nargs == 0);
    schema_free(&s);
    CHECK(schema_parse("add.Tensor(Tensor self, Tensor other) -> Tensor", &s, err, sizeof err) == 0);
    CHECK(!strcmp(s.name, "add.Tensor"));
    schema_free(&s);
}

/* str arguments, PyTorch-style: conv2d.padding's str padding="valid". */
static void str_arguments(void)
{
    schema s;
    char err[256] = "";
    int rc = schema_parse("conv2d.padding(Tensor input, Tensor weight, Tensor? bias=None, "
                          "int[2] stride=1, str padding=\"valid\", int[2] dilation=1, "
                          "int groups=1) -> Tensor",
                          &s, err, sizeof err);
    CHECKF(rc == OPJIT_OK, "%s", err);
    if (rc)
        return;
    CHECK(!strcmp(s.name, "conv2d.padding"));
    CHECK(s.args[4].kind == OPJIT_KIND_STR && !s.args[4].optional);
    CHECK(!strcmp(s.args[4].type, "str"));
    CHECK(s.args[4].has_default && s.args[4].def.kind == OPJIT_KIND_STR);
    CHECK(!strcmp(s.args[4].def.u.str, "valid"));
    CHECK(!strcmp(s.args[4].default_text, "\"valid\""));
    CHECK_STR_CONTAINS(s.canonical, "str padding=\"valid\"");
    schema_free(&s);

    /* single quotes, an empty default, an optional str and its None */
    rc = schema_parse("f(Tensor x, str a, str b='same', str c=\"\", str? d=None, str? e=None) "
                      "-> Tensor", &s, err, sizeof err);
    CHECKF(rc == OPJIT_OK, "%s", err);
    if (rc)
        return;
    CHECK(s.args[1].kind == OPJIT_KIND_STR && !s.args[1].has_default);
    CHECK(!strcmp(s.args[2].def.u.str, "same"));
    CHECK(s.args[3].def.kind == OPJIT_KIND_STR && !strcmp(s.args[3].def.u.str, ""));
    CHECK(s.args[4].optional && s.args[4].def.kind == OPJIT_KIND_NONE);
    CHECK(!strcmp(s.args[4].type, "str?"));
    CHECK(s.args[5].optional && s.args[5].def.kind == OPJIT_KIND_NONE);
    schema_free(&s);
}

/* Every kind of argument, an alias, defaults and two outputs, spelt back. */
static void canonical_form_of_every_kind(void)
{
    schema s;
    char err[256];
    const char *text = "k( Tensor(a!)  x,Tensor? b=None, int[2] st=1, int[3]? m=None, int n=-2,"
                       " float f=0.5, bool on=True, str pad=\"same\") -> (Tensor, Tensor, Tensor)";
    CHECKF(schema_parse(text, &s, err, sizeof err) == 0, "%s", err);
    CHECKF(!strcmp(s.canonical, "k(Tensor(a!) x, Tensor? b=None, int[2] st=1, int[3]? m=None, "
                                "int n=-2, float f=0.5, bool on=True, str pad=\"same\") -> "
                                "(Tensor, Tensor, Tensor)"),
           "%s", s.canonical);
    schema_free(&s);
}

static void canonical_form_ignores_spacing(void)
{
    schema a, b, c;
    char err[256];
    CHECK(schema_parse("mm(Tensor self,Tensor mat2)->Tensor", &a, err, sizeof err) == 0);
    CHECK(schema_parse("  mm( Tensor  self , Tensor mat2 )  ->  Tensor ", &b, err, sizeof err) == 0);
    CHECK(schema_parse("mm(Tensor self, Tensor other) -> Tensor", &c, err, sizeof err) == 0);
    CHECK(!strcmp(a.canonical, b.canonical));
    CHECK(strcmp(a.canonical, c.canonical) != 0);
    CHECK(!strcmp(a.canonical, "mm(Tensor self, Tensor mat2) -> Tensor"));
    schema_free(&a);
    schema_free(&b);
    schema_free(&c);
}

static void rejects_bad_schemas_with_a_position(void)
{
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"", "expected the operator name"},
        {"mm", "expected '('"},
        {"mm(Tensor self, Tensor mat2)", "expected '->'"},
        {"mm(Tensor self, Tensor mat2) -> int", "outputs must be Tensor"},
        {"mm(Tensr self) -> Tensor", "unknown type"},
        {"mm(Tensor) -> Tensor", "expected an argument name"},
        {"mm(Tensor a, Tensor a) -> Tensor", "duplicate argument name"},
        {"f(int x=1, int y) -> Tensor", "without a default follows"},
        {"f(int[0] x) -> Tensor", "list length"},
        {"f(int[9] x) -> Tensor", "list length"},
        {"f(float[2] x) -> Tensor", "only int lists"},
        {"f(Tensor x=1) -> Tensor", "Tensor defaults can only be None"},
        {"f(int x=None) -> Tensor", "None is a default only for optional"},
        {"f(int[2] x=[1]) -> Tensor", "expected ','"},
        {"f(int[2] x=[1, 2, 3]) -> Tensor", "wrong length"},
        {"f(bool b=maybe) -> Tensor", "expected True or False"},
        {"f(int x=abc) -> Tensor", "expected an integer default"},
        {"f(Tensor x) -> Tensor junk", "unexpected text"},
        {"f(Tensor x -> Tensor", "expected ',' or ')'"},
        {"f(str s=valid) -> Tensor", "expected a quoted string default"},
        {"f(str s=\"valid) -> Tensor", "unterminated string default"},
        {"f(str s='va\\'lid') -> Tensor", "escapes are not supported"},
        {"f(str s=None) -> Tensor", "None is a default only for optional"},
        {"f(str[2] s) -> Tensor", "only int lists"},
        {"f(string s) -> Tensor", "unknown type"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        schema s;
        char err[256] = "";
        int rc = schema_parse(bad[i].text, &s, err, sizeof err);
        CHECKF(rc == OPJIT_ESCHEMA, "'%s' gave %d", bad[i].text, rc);
        CHECK_STR_CONTAINS(err, bad[i].why);
        CHECK_STR_CONTAINS(err, "column");
    }
    schema s;
    char err[256];
    CHECK(schema_parse(NULL, &s, err, sizeof err) == OPJIT_ESCHEMA);
}

static void status_and_device_names(void)
{
    CHECK(!strcmp(opjit_status_name(OPJIT_OK), "OPJIT_OK"));
    CHECK(!strcmp(opjit_status_name(OPJIT_ECALL), "OPJIT_ECALL"));
    CHECK(!strcmp(opjit_status_name(-1), "OPJIT_?"));
    CHECK(!strcmp(opjit_status_name(OPJIT_STATUS_COUNT), "OPJIT_?"));
    CHECK(!strcmp(opjit_errstr(OPJIT_ENOMEM), "out of memory"));
    CHECK(!strcmp(opjit_device_name(OPJIT_CPU), "cpu"));
    CHECK(!strcmp(opjit_device_name(OPJIT_CUDA), "cuda"));
    CHECK(opjit_device_name(OPJIT_DEVICE_COUNT) == NULL);
    CHECK(opjit_version() == OPJIT_VERSION_NUMBER);
    CHECK(!strcmp(opjit_version_string(), "0.1.0"));
}

/* PyTorch's write annotation on inputs, output names kept; nothing else
 * may alias (opjit outputs are new tensors). */
static void mutation_and_output_names(void)
{
    schema s;
    char err[256];
    CHECK(schema_parse("fill(Tensor(a!) self, Tensor(b!)? out=None, float value=0) -> Tensor",
                       &s, err, sizeof err) == OPJIT_OK);
    CHECK(s.args[0].alias && !strcmp(s.args[0].alias, "a") && !s.args[0].optional);
    CHECK(s.args[1].alias && !strcmp(s.args[1].alias, "b") && s.args[1].optional);
    CHECK(!strcmp(s.args[1].type, "Tensor?") && !s.args[2].alias);
    CHECK_STR_CONTAINS(s.canonical, "Tensor(a!) self");
    schema_free(&s);
    CHECK(schema_parse("f(Tensor x) -> (Tensor values, Tensor indices)", &s, err, sizeof err) == 0);
    CHECK(s.out_names[0] && !strcmp(s.out_names[0], "values"));
    CHECK(s.out_names[1] && !strcmp(s.out_names[1], "indices"));
    schema_free(&s);
    CHECK(schema_parse("f(Tensor x) -> Tensor", &s, err, sizeof err) == 0 && !s.out_names[0]);
    schema_free(&s);
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"f(Tensor(a) x) -> Tensor", "must say '!'"},
        {"f(int(a!) x) -> Tensor", "only a Tensor can carry an alias annotation"},
        {"f(Tensor?(a!) x) -> Tensor", "only a Tensor can carry"},
        {"f(Tensor(a! x) -> Tensor", "expected ')' after the alias annotation"},
        {"f(Tensor(a!) x) -> Tensor(a!)", "an output cannot alias an input"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(schema_parse(bad[i].text, &s, err, sizeof err) == OPJIT_ESCHEMA, "%s", bad[i].text);
        CHECK_STR_CONTAINS(err, bad[i].msg);
    }
}

int main(void)
{
    T_RUN(mutation_and_output_names);
    T_RUN(parses_pytorch_signatures);
    T_RUN(defaults_of_every_type);
    T_RUN(str_arguments);
    T_RUN(canonical_form_ignores_spacing);
    T_RUN(canonical_form_of_every_kind);
    T_RUN(rejects_bad_schemas_with_a_position);
    T_RUN(status_and_device_names);
    return t_done();
}
