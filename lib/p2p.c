/* placeholder: being written */
typedef int tt_placeholder_t;
