/* runtime/env.c - one parser for each kind of environment setting. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
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

int env_size_parse(const char *s, uint64_t *out)
{
    if (!s)
        return -1;
    while (*s == ' ')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && *end == 'i')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    while (*end == ' ')
        end++;
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}
