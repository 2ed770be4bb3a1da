/* json_lines.h - the lines of a JSON Lines file (mrun --output), parsed,
 * for the end-to-end tests of the dataset job. */
#ifndef JSON_LINES_H
#define JSON_LINES_H

#include <stddef.h>

#include <jansson.h>

/* Every non-empty line of the file at path, parsed (*n of them; a line that
 * is not JSON fails the test).  Free with tu_json_lines_free. */
json_t **tu_json_lines(const char *path, size_t *n);
void tu_json_lines_free(json_t **v, size_t n);

#endif /* JSON_LINES_H */
