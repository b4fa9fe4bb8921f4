/* runtime/env.c - one parser for each kind of environment setting. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/env.h"

int env_bool_parse(const char *text, int dflt)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    if (!text)
        return dflt;
    while (isspace((unsigned char)*text))
        text++;
    size_t n = strlen(text);
    while (n && isspace((unsigned char)text[n - 1]))
        n--;
    if (n == 0)
        return dflt;
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strlen(yes[i]) == n && !strncasecmp(text, yes[i], n))
            return 1;
        if (strlen(no[i]) == n && !strncasecmp(text, no[i], n))
            return 0;
    }
    return -1;
}

long env_seconds_parse(const char *text, long dflt_ms)
{
    if (!text || !*text)
        return dflt_ms;
    char *end;
    errno = 0;
    double s = strtod(text, &end);
    while (isspace((unsigned char)*end))
        end++;
    if (errno || end == text || *end || !(s >= 0) || s > 1e7)
        return -1;
    return (long)llround(s * 1000.0);
}
