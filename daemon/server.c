/* placeholder: being written */
typedef int sk__placeholder_t;
